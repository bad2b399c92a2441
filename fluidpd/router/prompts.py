"""OpenAI prompts to token ids, with the served model's own tokenizer and chat template.

The tokenizer is ``transformers``' (``AutoTokenizer`` on the local model directory, which sets
up the ``tokenizers`` backend exactly as ``transformers`` uses it), so a completion prompt
encodes to ``tokenizer(prompt)["input_ids"]`` and a chat to
``apply_chat_template(messages, add_generation_prompt=True)``: the template is rendered by
transformers and the text encoded without adding special tokens again, as transformers does.

Encoding is called on the backend's ``encode_batch``, which releases the GIL, so a long prompt
is tokenized on a worker thread while the event loop keeps serving other requests; short ones
(most) are tokenized inline, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers import AutoTokenizer

from fluidpd.modeldir.model_dir import ModelDir, ModelDirError

#: Prompts longer than this (characters) are tokenized off the event loop (about 1K tokens:
#: a fraction of a millisecond inline below it).
INLINE_CHARS = 4096


class PromptError(ValueError):
    """The prompt cannot be served (HTTP 400); the message starts with the field's name."""


class Prompter:
    def __init__(self, model: ModelDir, threads: int = 2) -> None:
        try:
            self.hf = AutoTokenizer.from_pretrained(str(model.path), local_files_only=True)
        except Exception as exc:  # transformers raises many types; all mean a bad directory
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelDirError(f"{model.path}: the tokenizer does not load ({first})") from None
        self.model = model
        backend = self.hf.backend_tokenizer
        # What transformers' __call__ sets before encoding (no truncation, no padding, special
        # tokens in the text recognised), done once here so the hot path never mutates the
        # backend (it is shared by the inline path and the worker threads).
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(getattr(self.hf, "split_special_tokens", False))
        self._backend = backend
        self.vocab_size = model.vocab_size
        self.has_chat_template = model.chat_template is not None or bool(
            getattr(self.hf, "chat_template", None)
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- synchronous (any thread) ---------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        enc = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(enc[0].ids)

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        if not self.has_chat_template:
            raise PromptError(
                f"messages: model {self.model.path.name} has no chat template "
                "(tokenizer_config.json); use /v1/completions"
            )
        try:
            text = self.hf.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # a template's raise_exception(), or a render error
            raise PromptError(f"messages: the chat template refused them: {exc}") from None
        return str(text)

    def chat_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render_chat(messages), add_special_tokens=False)

    def check_ids(self, ids: Sequence[int], field: str = "prompt") -> list[int]:
        if not ids:
            raise PromptError(f"{field}: empty")
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise PromptError(f"{field}: token id {bad} is not in [0, {self.vocab_size})")
        return list(ids)

    # -- from the event loop ----------------------------------------------------------------------
    async def prompt_ids(self, text: str) -> list[int]:
        if len(text) <= INLINE_CHARS:
            return self.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.encode, text)

    async def chat_prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        size = sum(len(str(m.get("content") or "")) for m in messages)
        if size <= INLINE_CHARS:
            return self.chat_ids(messages)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.chat_ids, messages)
