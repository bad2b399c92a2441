"""Real prompts through a live stack with the sim engine and a model directory (1P1D, real
processes, real HTTP, the official openai client): the model's tokenizer counts prompts, the
engine's ids come from its vocabulary, and stopping, streaming detokenization and log-probs
run the same path as with a real model, with the split pinned at beta = 0, 0.5 and 1.

The sim engine's greedy output is a hash of the prompt ids (``SimEngine``), so the expected
ids come from a local instance of the same engine; the served text must be their decode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from fluidpd.api.sampling import SamplingParams
from fluidpd.cli.drill_cmd import FAST_PROFILE
from fluidpd.drills.stack import LocalStack
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd.profiles import load_profile_file
from fluidpd.router.prompts import INLINE_CHARS
from fluidpd_sidecar.engine import SimEngine

transformers = pytest.importorskip("transformers")

MODEL = "serving-path"
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Emoji: 😀 🚀 👩‍💻 🇯🇵 and 東京は日本の首都です。",
    "我们正在测试一个大型语言模型的服务系统",
]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "serving-path.yaml"
    path.write_text(FAST_PROFILE)
    return path


@pytest.fixture(scope="module")
def hf(tiny_qwen3_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))


@pytest.fixture(scope="module", params=[0.0, 0.5, 1.0], ids=lambda b: f"beta={b}")
def client(
    request: pytest.FixtureRequest,
    tiny_qwen3_dir: Path,
    profile_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[openai.OpenAI]:
    run_dir = tmp_path_factory.mktemp("stack")
    extra = ("--profile", str(profile_path), "--model-dir", str(tiny_qwen3_dir),
             "--force-steal", str(request.param), "--noise", "0")  # fmt: skip
    stack = LocalStack(run_dir, "1P1D", "static", *extra, token="t")
    with stack:
        yield openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="unused", max_retries=0)
        leftovers = stack.stop()
    assert not leftovers
    for log in run_dir.glob("*.log"):
        assert "Traceback" not in log.read_text(), log


@pytest.fixture(scope="module")
def sim(tiny_qwen3_dir: Path, profile_path: Path) -> tuple[SimEngine, TokenText]:
    text = TokenText.from_model_dir(load_model_dir(tiny_qwen3_dir))
    return SimEngine(load_profile_file(profile_path), text.text_ids()), text


def expected(sim: tuple[SimEngine, TokenText], prompt_ids: list[int], n: int) -> list[int]:
    engine, _ = sim
    engine.admit(1, prompt_ids, SamplingParams(max_new_tokens=n, temperature=0.0))
    ids = [t.id for t in engine.outputs(1, 0, n)]
    engine.release(1)
    return ids


def stream_text(chunks: Any, chat: bool) -> tuple[str, str | None, list[str]]:
    parts, finish = [], None
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        parts.append((ch.delta.content if chat else ch.text) or "")
        finish = ch.finish_reason or finish
    return "".join(parts), finish, parts


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completions_are_the_engines_ids_decoded(
    client: openai.OpenAI, hf: Any, sim: tuple[SimEngine, TokenText], prompt: str
) -> None:
    ids = hf(prompt)["input_ids"]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    want = expected(sim, ids, 12)
    assert r.choices[0].text == hf.decode(want, skip_special_tokens=True)
    # The same prompt as token ids; and streamed: byte for byte the same text.
    again = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert again.choices[0].text == r.choices[0].text
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, finish, _ = stream_text(chunks, chat=False)
    assert text == r.choices[0].text and finish == "length"


def test_chat_uses_the_chat_template(
    client: openai.OpenAI, hf: Any, sim: tuple[SimEngine, TokenText]
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello 😀 你好"},
    ]
    ids = hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9,
                                       temperature=0)  # fmt: skip
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    want = hf.decode(expected(sim, ids, 9), skip_special_tokens=True)
    assert r.choices[0].message.content == want
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9,
                                            temperature=0, stream=True)  # fmt: skip
    text, finish, _ = stream_text(chunks, chat=True)
    assert text == r.choices[0].message.content and finish == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_and_stop_ids_end_the_output_early(
    client: openai.OpenAI, hf: Any, sim: tuple[SimEngine, TokenText], stream: bool
) -> None:
    prompt = PROMPTS[0]
    ids = hf(prompt)["input_ids"]
    out = expected(sim, ids, 40)
    full = hf.decode(out, skip_special_tokens=True)
    # A stop string from the middle of what the engine will say, spanning a token boundary.
    cut = len(hf.decode(out[:20], skip_special_tokens=True)) - 2
    stop = full[cut : cut + 4]
    assert len(stop) == 4 and stop.strip()
    first = full.index(stop)
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 40,
                              "temperature": 0, "stop": [stop, "never-said"]}  # fmt: skip
    if stream:
        chunks = client.completions.create(**kwargs, stream=True,
                                           stream_options={"include_usage": True})  # fmt: skip
        text, finish, parts = stream_text(chunks, chat=False)
        assert not any(stop in p for p in parts)
    else:
        r = client.completions.create(**kwargs)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage is not None and r.usage.completion_tokens < 40
    assert text == full[:first] and finish == "stop"
    # A stop token id: the output ends with the token before it; the token counts.
    at = next(k for k in range(3, 40) if out[k] not in out[:k])
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                  extra_body={"stop_token_ids": [out[at]]})  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == at + 1
    assert r.choices[0].text == hf.decode(out[:at], skip_special_tokens=True)


def test_logprobs_in_both_formats(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content is not None and len(content) == 8
    spelled = b"".join(bytes(e.bytes or []) for e in content).decode()
    # (A byte-fallback tokenizer's first token carries a word-start space its decoder strips.)
    assert spelled.removeprefix(" ") == r.choices[0].message.content
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in content)
    c = client.completions.create(model=MODEL, prompt="hi", max_tokens=6, temperature=0,
                                  logprobs=2)  # fmt: skip
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 6
    assert lp.token_logprobs is not None and len(lp.token_logprobs) == 6
    assert lp.text_offset == sorted(lp.text_offset or [])
    assert lp.top_logprobs is not None and all(len(t) >= 1 for t in lp.top_logprobs)


def test_a_seed_reproduces_a_sampled_output(client: openai.OpenAI) -> None:
    def ask(seed: int) -> str:
        r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                      temperature=0.9, seed=seed)  # fmt: skip
        return r.choices[0].text

    assert ask(7) == ask(7)
    assert len({ask(7), ask(8), ask(9)}) > 1


def test_a_long_text_prompt_is_counted_exactly(client: openai.OpenAI, hf: Any) -> None:
    prompt = " ".join([PROMPTS[0]] * 150 + [PROMPTS[1]])
    assert len(prompt) > INLINE_CHARS  # tokenized on the router's worker thread
    ids = hf(prompt)["input_ids"]
    assert 1500 < len(ids) < 4000
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
