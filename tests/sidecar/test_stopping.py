"""The decode side's per-request output: stop ids, EOS, stop strings (not returned, never shown
in part), held-back text, log-probs, and the text adding up to the non-streamed one."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.text import TokenText, load_tokenizer
from fluidpd_sidecar.stopping import OutputStream, held_suffix

MODEL = resolve_model_dir(None)


@pytest.fixture(scope="module")
def text() -> TokenText:
    return TokenText(load_tokenizer(MODEL))


@pytest.fixture(scope="module")
def tok(text: TokenText) -> Tokenizer:
    return text.tokenizer


def ids_of(tok: Tokenizer, s: str) -> list[int]:
    return list(tok.encode(s, add_special_tokens=False).ids)


def run(
    text: TokenText, ids: list[int], step: int = 1, **sampling: object
) -> tuple[OutputStream, list[str]]:
    params = SamplingParams(max_new_tokens=len(ids) + 1, **sampling)  # type: ignore[arg-type]
    out = OutputStream(text, params, MODEL.eos_token_ids)
    parts = []
    for i in range(0, len(ids), step):
        out.feed(SampledToken(t) for t in ids[i : i + step])
        parts.append(out.take()[1])
        if out.finish:
            break
    out.end()
    parts.append(out.take(final=True)[1])
    return out, parts


def test_held_suffix() -> None:
    assert held_suffix("hello wor", ["world"]) == 3
    assert held_suffix("hello", ["xyz", "lo!"]) == 2
    assert held_suffix("abc", ["d"]) == 0
    assert held_suffix("aaa", ["aab"]) == 2


def test_no_stop_runs_to_length_and_adds_up(text: TokenText, tok: Tokenizer) -> None:
    ids = ids_of(tok, "Hello 😀 你好 résumé")
    out, parts = run(text, ids)
    assert out.finish is None and out.count == len(ids)
    assert "".join(parts) == text.decode(ids) == "Hello 😀 你好 résumé"


@pytest.mark.parametrize("step", [1, 3])
def test_a_stop_string_ends_the_text_before_it(text: TokenText, tok: Tokenizer, step: int) -> None:
    ids = ids_of(tok, "The quick brown fox jumps over the lazy dog")
    out, parts = run(text, ids, step, stop=["fox j", "zzz"])
    assert out.finish == "stop"
    assert "".join(parts) == "The quick brown "
    # The token that completed the stop string is the last one counted; none after it.
    assert text.decode(ids[: out.count]).startswith("The quick brown fox j")
    assert not text.decode(ids[: out.count - 1]).startswith("The quick brown fox j")
    # Text is held back while it could still be the start of a stop string: no part of the
    # stop string is ever released, even though "fox" was complete several tokens earlier.
    assert not any("f" in p for p in parts)


def test_the_earliest_stop_string_wins_and_may_span_tokens(text: TokenText, tok: Tokenizer) -> None:
    ids = ids_of(tok, "Once upon a time, in a land far away")
    out, parts = run(text, ids, stop=["land", "e, i"])
    assert "".join(parts) == "Once upon a tim" and out.finish == "stop"


def test_eos_and_stop_ids(text: TokenText, tok: Tokenizer) -> None:
    eos = MODEL.eos_token_ids[0]
    ids = [*ids_of(tok, "Grüße aus München"), eos, *ids_of(tok, " more")]
    out, parts = run(text, ids)
    assert out.finish == "stop" and out.count == len(ids) - len(ids_of(tok, " more"))
    assert "".join(parts) == "Grüße aus München"  # EOS counted, its text not returned
    out, parts = run(text, ids, ignore_eos=True)
    assert out.finish is None and out.count == len(ids)
    assert "".join(parts) == "Grüße aus München more"
    stop_id = ids_of(tok, " aus")[0]
    out, parts = run(text, ids, stop_token_ids=[stop_id], ignore_eos=True)
    assert out.finish == "stop" and "".join(parts) == "Grüße"


def test_engine_reported_finish(text: TokenText, tok: Tokenizer) -> None:
    out = OutputStream(text, SamplingParams(max_new_tokens=9), ())
    a, b, c = ids_of(tok, "the cat sat on the mat")[:3]
    assert out.feed([SampledToken(a), SampledToken(b, finish="stop"), SampledToken(c)])
    assert out.finish == "stop" and out.count == 2


def test_logprobs_carry_each_tokens_bytes(text: TokenText, tok: Tokenizer) -> None:
    ids = ids_of(tok, "東京 😀")
    params = SamplingParams(max_new_tokens=20, logprobs=True, top_logprobs=2)
    out = OutputStream(text, params, ())
    out.feed(SampledToken(i, -0.5, ((i, -0.5), (7, -1.5))) for i in ids)
    got, _, lps = out.take()
    assert got == ids and lps is not None and len(lps) == len(ids)
    assert b"".join(bytes(lp.bytes) for lp in lps).decode() == "東京 😀"
    assert all(lp.logprob == -0.5 and [t.id for t in lp.top] == [lp.id, 7] for lp in lps)
    # A token holding part of a character reports its bytes exactly; its text is lossy.
    partial = [lp for lp in lps if "\ufffd" in lp.token]
    assert partial and all(bytes(lp.bytes) != lp.token.encode() for lp in partial)
