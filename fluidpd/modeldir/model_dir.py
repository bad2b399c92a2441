"""A local Hugging Face model directory: what a user deploys (``--model-dir DIR``).

The layout of a released checkpoint: ``config.json`` (architecture and shape),
``generation_config.json`` (EOS ids), ``tokenizer.json`` (a fast tokenizer) with
``tokenizer_config.json`` (special tokens, the chat template; or ``chat_template.jinja``
beside it, as newer checkpoints save it), and ``*.safetensors`` weights, sharded with
``model.safetensors.index.json``. Everything is read from local files: a hub id is refused,
since serving must never depend on a download at start.

``load_model_dir`` checks what every FluidPD process needs (the router: tokenizer and chat
template; sidecars: tokenizer and EOS ids) and raises ``ModelDirError`` with one line naming
the missing or bad file. The weights files are checked from their safetensors headers by
``weights.check_weights`` (the sglang sidecar, before it spawns SGLang); their tensors against
the architecture are the gpu engine's to check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``org/name`` or ``name`` as the Hugging Face hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelDirError(ValueError):
    """A model directory cannot be served; the message is one line naming the file."""


def _read_json(path: Path, required: bool = True) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise ModelDirError(f"{path}: missing")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise ValueError(f"expected token ids, got {value!r}")
    return [int(i) for i in items]


@dataclass(frozen=True, slots=True)
class ModelDir:
    path: Path
    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    #: The Jinja chat template (None: a base model, served by ``/v1/completions`` only).
    chat_template: str | None
    #: What ends a turn (``generation_config.json``, else ``config.json``).
    eos_token_ids: tuple[int, ...]
    #: Rows of the model's embedding: every valid token id is below it.
    vocab_size: int

    @property
    def tokenizer_file(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or [""]
        return str(archs[0])

    @property
    def max_position_embeddings(self) -> int | None:
        """The model's longest context, when ``config.json`` says (nested ``text_config`` too)."""
        for cfg in (self.config, self.config.get("text_config") or {}):
            value = cfg.get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value
        return None

    def context_limit(self, serving_limit: int) -> int:
        """The serving profile's context limit, capped at the model's own."""
        positions = self.max_position_embeddings
        return min(serving_limit, positions) if positions else serving_limit


def _chat_template(path: Path, tokenizer_config: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if template is None:
        return None
    if isinstance(template, list):  # named templates: the "default" one serves chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        raise ModelDirError(f"{path / 'tokenizer_config.json'}: chat_template is not a template")
    return template


def load_model_dir(where: str | Path) -> ModelDir:
    """Reads and checks a local model directory (see the module docstring)."""
    path = Path(where).expanduser()
    if not path.exists():
        if isinstance(where, str) and _HUB_ID.match(where) and "/" in where:
            raise ModelDirError(
                f"{where}: not a local directory; hub ids are not downloaded (download the "
                f"model, e.g. with `hf download {where} --local-dir DIR`, and give DIR)"
            )
        raise ModelDirError(f"{path}: no such directory")
    if not path.is_dir():
        raise ModelDirError(f"{path}: not a directory")
    config = _read_json(path / "config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json", required=False) or {}
    assert config is not None and tokenizer_config is not None
    if not (path / "tokenizer.json").is_file():
        raise ModelDirError(
            f"{path / 'tokenizer.json'}: missing (a fast tokenizer file is required; "
            "slow sentencepiece-only tokenizers are not supported)"
        )
    text_config = config.get("text_config") or {}
    vocab = config.get("vocab_size", text_config.get("vocab_size"))
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelDirError(f"{path / 'config.json'}: vocab_size missing or not a positive int")
    source = "generation_config.json" if "eos_token_id" in generation else "config.json"
    raw_eos = (
        generation["eos_token_id"]
        if "eos_token_id" in generation
        else config.get("eos_token_id", text_config.get("eos_token_id"))
    )
    try:
        eos = _ids(raw_eos)
    except ValueError as exc:
        raise ModelDirError(f"{path / source}: eos_token_id: {exc}") from None
    if not eos:
        raise ModelDirError(
            f"{path / 'generation_config.json'}: no eos_token_id (nor in config.json)"
        )
    if max(eos) >= vocab:
        raise ModelDirError(f"{path / source}: eos_token_id {max(eos)} >= vocab_size {vocab}")
    return ModelDir(
        path=path,
        config=config,
        generation_config=generation,
        tokenizer_config=tokenizer_config,
        chat_template=_chat_template(path, tokenizer_config),
        eos_token_ids=tuple(dict.fromkeys(eos)),
        vocab_size=vocab,
    )
