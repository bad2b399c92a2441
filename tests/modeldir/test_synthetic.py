"""Synthetic model directories are real Hugging Face checkpoints with a real tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fluidpd.modeldir.synthetic import corpus, write_model, write_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["bytelevel", "bytefallback"])
def test_the_tokenizer_is_the_same_file_every_time(kind: str, tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "a", "llama", kind)  # type: ignore[arg-type]
    write_tokenizer(tmp_path / "b", "llama", kind)  # type: ignore[arg-type]
    assert _digest(tmp_path / "a" / "tokenizer.json") == _digest(tmp_path / "b" / "tokenizer.json")


def test_the_tokenizer_learned_merges_from_the_corpus(tiny_llama_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    line = corpus()[0]
    ids = tok.encode(line, add_special_tokens=False)
    assert len(ids) < len(line.encode()) / 2  # words, not bytes
    assert tok.decode(ids) == line


def test_byte_fallback_spells_unknown_characters_in_bytes(tiny_qwen3_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    ids = tok.encode("你", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert [p for p in pieces if p.startswith("<0x")] == ["<0xE4>", "<0xBD>", "<0xA0>"]
    text = "Hello 😀 你好 résumé 🇯🇵"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_templates_render_like_the_family(tiny_llama_dir: Path, tiny_qwen3_dir: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    llama = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    assert llama.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    qwen = transformers.AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    assert qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_model_loads_sharded_and_generates_deterministically(
    tiny_qwen3_dir: Path, tmp_path: Path
) -> None:
    index = json.loads((tiny_qwen3_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    gen = json.loads((tiny_qwen3_dir / "generation_config.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    assert gen["eos_token_id"][0] == tok.convert_tokens_to_ids("<|im_end|>")
    again = write_model(
        tmp_path / "again", "qwen3", tokenizer="bytefallback", max_shard_size="100KB"
    )
    outputs = []
    for path in (tiny_qwen3_dir, again.path):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path))
        ids = torch.tensor([tok.encode("The quick brown fox")])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             do_sample=False)  # fmt: skip
        outputs.append(out[0].tolist())
    assert outputs[0] == outputs[1]


def test_a_large_vocabulary_is_padded_with_reserved_tokens(tmp_path: Path) -> None:
    size = write_tokenizer(tmp_path, "llama", pad_to=2000)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert size == len(tok) == 2000
    assert tok.decode([1999], skip_special_tokens=True) == ""


@pytest.mark.parametrize(
    ("pad_special", "decoded"), [(True, ""), (False, "<|reserved_special_token_0|>")]
)
def test_padding_tokens_are_skipped_only_when_special(
    pad_special: bool, decoded: str, tmp_path: Path
) -> None:
    size = write_tokenizer(tmp_path, "llama", pad_to=2048, pad_special=pad_special)
    assert size == 2048
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    first_pad = tok.convert_tokens_to_ids("<|reserved_special_token_0|>")
    assert tok.decode([first_pad], skip_special_tokens=True) == decoded
