"""Synthetic Hugging Face model directories: random weights from a seed, a real BPE tokenizer.

What a benchmark or a test deploys when no released checkpoint is at hand (and none can be
downloaded): the same files a released model has (``config.json``, ``generation_config.json``,
``tokenizer.json`` + ``tokenizer_config.json`` with a chat template, ``*.safetensors``, sharded
with ``model.safetensors.index.json`` when asked), written by ``transformers`` itself, so every
engine (ours, SGLang, ``transformers``) loads the identical model.

The tokenizer is trained by ``tokenizers`` on a fixed corpus (English, code, accented Latin,
CJK, emoji), so it is real BPE with merges, special tokens and a chat template, and the same
arguments always give byte-identical files. Two kinds:

``bytelevel``
    GPT-2 / Llama-3 / Qwen style byte-level BPE: every UTF-8 byte is a symbol, so one
    character can span several tokens and a token can end inside a character.
``bytefallback``
    Llama-2 / Mistral style: characters the vocabulary lacks are spelled as ``<0xAB>`` byte
    tokens (``BPE(byte_fallback=True)``, ``Metaspace``), the other way a token stream can cut
    a multi-byte character.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TokenizerKind = Literal["bytelevel", "bytefallback"]
Arch = Literal["llama", "qwen3"]

# fmt: off
_CORPUS_LINES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Prefill computes the prompt's key-value cache; decode then generates one token at a time.",
    "A scheduler batches requests so that the time to first token stays within its objective.",
    "When a burst of long prompts arrives, the queue grows and deadlines are missed.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a",
    "for (int i = 0; i < n; ++i) { sum += values[i] * weights[i]; }",
    "SELECT name, count(*) FROM requests WHERE latency_ms > 200 GROUP BY name;",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 128 256 1024 4096 3.14159 2.71828 -1 +7 100%",
    "Punctuation, quotes \"like these\", 'single', (parentheses) [brackets] {braces} <angles>!?",
    "Café, naïve, résumé, über, façade, jalapeño, smörgåsbord, Ærøskøbing, Łódź, İstanbul.",
    "Grüße aus München! ¿Qué tal? Ça va très bien, merci. Señor Muñoz lee el periódico.",
    "東京は日本の首都です。今日はとても良い天気ですね。",
    "我们正在测试一个大型语言模型的服务系统，它需要处理中文、英文和表情符号。",
    "서울은 한국의 수도입니다. 안녕하세요, 만나서 반갑습니다.",
    "Привет, мир! Это тестовый текст для токенизатора.",
    "Emoji: 😀 😃 😄 🚀 🔥 ✨ 🎉 👍 🙏 ❤️ 🌍 🤖 👩‍💻 🇯🇵",
    "Mixed: the model said 你好 and then 😀 before writing résumé in code: print('héllo 🌍')",
    "Once upon a time, in a land far away, there lived a curious engineer who loved GPUs.",
    "She asked the assistant to summarize the report, translate it, and list three key points.",
    "Tokens per second, requests per second, and the fraction of requests within their SLO.",
)
# fmt: on

#: Repetitions of the corpus for training: merges need pair counts, not new text.
_CORPUS_REPEAT = 8

LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True, slots=True)
class Specials:
    """A family's special tokens and how a prompt starts and a turn ends."""

    tokens: tuple[str, ...]
    bos: str | None
    eos: tuple[str, ...]
    pad: str
    chat_template: str


SPECIALS: dict[Arch, Specials] = {
    "llama": Specials(
        tokens=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        bos="<|begin_of_text|>",
        eos=("<|eot_id|>", "<|end_of_text|>"),
        pad="<|end_of_text|>",
        chat_template=LLAMA_CHAT_TEMPLATE,
    ),
    "qwen3": Specials(
        tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos=None,
        eos=("<|im_end|>", "<|endoftext|>"),
        pad="<|endoftext|>",
        chat_template=QWEN_CHAT_TEMPLATE,
    ),
}


def corpus() -> list[str]:
    """The fixed training text (public so tests can draw prompts the vocabulary knows)."""
    return list(_CORPUS_LINES) * _CORPUS_REPEAT


def _train(kind: TokenizerKind, specials: Specials, vocab_size: int) -> Tokenizer:
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=list(specials.tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(corpus(), trainer=trainer)
        return tok
    # Byte fallback: train on characters, with an alphabet of Latin letters only (so CJK,
    # Cyrillic, Hangul and emoji are spelled in bytes), then add the 256 byte tokens as
    # ordinary vocabulary entries. The alphabet is given, not picked by frequency, because the
    # trainer breaks frequency ties in hash order and the files would differ run to run.
    alphabet = sorted({c for line in _CORPUS_LINES for c in line if ord(c) < 0x250} | {"▁"})
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(specials.tokens),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    n_special = len(specials.tokens)
    rest = sorted((i, t) for t, i in vocab.items() if i >= n_special)
    new_vocab = {t: i for t, i in vocab.items() if i < n_special}
    for b in range(256):
        new_vocab[f"<0x{b:02X}>"] = n_special + b
    for _, t in rest:
        if t not in new_vocab:
            new_vocab[t] = len(new_vocab)
    data["model"]["vocab"] = new_vocab
    data["model"]["byte_fallback"] = True
    data["model"]["fuse_unk"] = True
    data["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    for added in data["added_tokens"]:
        added["id"] = new_vocab[added["content"]]
    return Tokenizer.from_str(json.dumps(data))


def _add_bos(tok: Tokenizer, specials: Specials) -> None:
    if specials.bos is None:
        return
    bos_id = tok.token_to_id(specials.bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{specials.bos} $A",
        pair=f"{specials.bos} $A {specials.bos} $B",
        special_tokens=[(specials.bos, bos_id)],
    )


def write_tokenizer(
    out: str | Path,
    arch: Arch = "llama",
    kind: TokenizerKind = "bytelevel",
    vocab_size: int = 1024,
    pad_to: int | None = None,
    model_max_length: int = 4096,
    pad_special: bool = True,
) -> int:
    """Trains the tokenizer and writes ``tokenizer.json`` and ``tokenizer_config.json`` (with
    the family's chat template) into ``out``; returns the vocabulary size.

    ``pad_to`` appends reserved special tokens (as Llama-3 does) until the vocabulary has that
    many entries, so a model shape with a large vocabulary never produces an id the tokenizer
    does not know. ``pad_special=False`` makes them ordinary tokens that decode to their own
    text: benchmarks with random weights pick padding ids most of the time, and a client that
    times the first token by the first non-empty text (as ``fluidpd replay`` and the OpenAI
    clients do) would otherwise see no text at all.
    """
    specials = SPECIALS[arch]
    tok = _train(kind, specials, vocab_size)
    _add_bos(tok, specials)
    size = int(tok.get_vocab_size(with_added_tokens=True))
    if pad_to is not None and pad_to > size:
        pads = [
            AddedToken(f"<|reserved_special_token_{i}|>", special=pad_special, normalized=False)
            for i in range(pad_to - size)
        ]
        # ``add_special_tokens`` marks every token special whatever its flag says.
        if pad_special:
            tok.add_special_tokens(pads)
        else:
            tok.add_tokens(pads)
        size = pad_to
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": specials.bos,
        "eos_token": specials.eos[0],
        "pad_token": specials.pad,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": specials.chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    return size


@dataclass(frozen=True, slots=True)
class SyntheticModel:
    """What ``write_model`` wrote."""

    path: Path
    arch: Arch
    vocab_size: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    files: list[str] = field(default_factory=list)


#: The CI shapes (the ``tiny-llama`` / ``tiny-qwen3`` twins of the gpu engine's table).
TINY_SHAPES: dict[Arch, dict[str, Any]] = {
    "llama": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
    "qwen3": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
}


def write_model(
    out: str | Path,
    arch: Arch = "llama",
    *,
    seed: int = 0,
    tokenizer: TokenizerKind = "bytelevel",
    tokenizer_vocab: int = 1024,
    shape: dict[str, Any] | None = None,
    init_std: float = 0.2,
    max_shard_size: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
) -> SyntheticModel:
    """Writes a complete model directory: tokenizer first (the model's vocabulary is its size,
    or ``shape['vocab_size']`` when that is larger, padded with reserved tokens), then a
    ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` initialised from ``seed`` and saved by
    ``save_pretrained`` as safetensors (sharded when ``max_shard_size`` is given).

    ``init_std`` is the weights' initialiser scale: larger than a trained model's 0.02 so that
    random logits are peaked and greedy decoding is not decided by rounding.
    """
    # torch and transformers are heavy and only the writer needs them (tests, benchmarks).
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    out = Path(out)
    fields = dict(TINY_SHAPES[arch] if shape is None else shape)
    want_vocab = fields.pop("vocab_size", None)
    vocab = write_tokenizer(
        out,
        arch,
        tokenizer,
        tokenizer_vocab,
        pad_to=want_vocab,
        model_max_length=int(fields.get("max_position_embeddings", 4096)),
    )
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    specials = SPECIALS[arch]
    eos = [int(tok.token_to_id(t)) for t in specials.eos]
    bos = int(tok.token_to_id(specials.bos)) if specials.bos else None
    pad = int(tok.token_to_id(specials.pad))
    config_cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen3Config
    model_cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen3ForCausalLM
    config = config_cls(
        vocab_size=vocab,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        initializer_range=init_std,
        dtype=dtype,
        **fields,
    )
    torch_dtype = getattr(torch, dtype)
    with torch.device(device):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch_dtype)
    model.eval()
    save: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size is not None:
        save["max_shard_size"] = max_shard_size
    model.save_pretrained(str(out), **save)
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    files = sorted(p.name for p in out.iterdir())
    return SyntheticModel(out, arch, vocab, eos, bos, files)
