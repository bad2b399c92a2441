"""Streaming detokenization adds up to the one-shot decode, byte for byte, on byte-level and
byte-fallback tokenizers, and never shows half a character of valid text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from fluidpd.modeldir.detokenize import IncrementalDetokenizer
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.modeldir.synthetic import write_tokenizer
from fluidpd.modeldir.text import TokenText, load_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Emoji: 😀 🚀 👩‍💻 🇯🇵 ❤️ and more 🤖🤖",
    "東京は日本の首都です。我们正在测试。서울은 한국의 수도입니다.",
    "Mixed: 你好 then 😀 before résumé in code: print('héllo 🌍')",
    "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 🫠 — “quotes” … ½",
]


@pytest.fixture(scope="module", params=["bytelevel", "bytefallback"])
def text(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TokenText:
    out = tmp_path_factory.mktemp(request.param)
    arch = "llama" if request.param == "bytelevel" else "qwen3"
    write_tokenizer(out, arch, request.param)
    return TokenText(Tokenizer.from_file(str(out / "tokenizer.json")))


def stream(text: TokenText, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(text)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("sample", TEXTS)
def test_stream_equals_decode_on_real_text(text: TokenText, sample: str) -> None:
    ids = text.tokenizer.encode(sample, add_special_tokens=False).ids
    deltas = stream(text, ids)
    assert "".join(deltas) == text.decode(ids) == sample
    # A multi-byte character split over tokens is held until complete: no delta has half of one.
    assert all("\ufffd" not in d for d in deltas)

    def whole(tid: int) -> bool:
        try:
            text.token_bytes(tid).decode()
        except UnicodeDecodeError:
            return False
        return True

    if not all(whole(i) for i in ids):  # some token holds part of a character
        assert len(ids) > len([d for d in deltas if d])


def test_stream_equals_decode_on_arbitrary_ids(text: TokenText) -> None:
    """Random ids (special tokens, stray bytes, runs of byte tokens that are not valid UTF-8)
    still add up to exactly what a one-shot decode renders."""
    rng = random.Random(7)
    hard = sorted(text.run_ids | text.special_ids)
    for _ in range(400):
        ids = [rng.randrange(text.size) for _ in range(rng.randrange(1, 40))]
        if hard and rng.random() < 0.5:
            ids = [rng.choice(hard) if rng.random() < 0.4 else i for i in ids]
        assert "".join(stream(text, ids)) == text.decode(ids), ids


def test_decode_is_transformers_decode(tiny_llama_dir: Path, tiny_qwen3_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    rng = random.Random(3)
    for d in (tiny_llama_dir, tiny_qwen3_dir):
        hf = transformers.AutoTokenizer.from_pretrained(str(d))
        ours = TokenText(load_tokenizer(load_model_dir(d)))
        for sample in TEXTS:
            ids = hf.encode(sample)
            assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        for _ in range(50):
            ids = [rng.randrange(ours.size) for _ in range(30)]
            assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_token_bytes_spell_the_text(text: TokenText) -> None:
    for sample in TEXTS:
        ids = text.tokenizer.encode(sample, add_special_tokens=False).ids
        raw = b"".join(text.token_bytes(i) for i in ids)
        # Byte-fallback tokenizers mark word starts with a space the decoder strips at the start.
        assert raw.decode() in (sample, " " + sample)
