"""FluidPD's request halves as SGLang ``/generate`` bodies, and SGLang's answers as tokens.

SGLang runs with ``--skip-tokenizer-init``: ids in, ids out, so the sidecar's own tokenizer
(the model directory's) detokenizes and applies stop strings, as with every engine. Both
halves of a request carry SGLang's P/D bootstrap triple: the prefill server's bootstrap
address and the request id as ``bootstrap_room`` (FluidPD's rids are 63-bit for this reason).
"""

from __future__ import annotations

from typing import Any

from fluidpd.api.sampling import FinishReason, SampledToken, SamplingParams


def sampling_params(s: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        # FluidPD's 0 means "off", as OpenAI's; SGLang's "off" is -1.
        "top_k": s.top_k if s.top_k > 0 else -1,
        "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repetition_penalty": s.repetition_penalty,
        "ignore_eos": s.ignore_eos,
    }
    if s.stop_token_ids:
        out["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        out["sampling_seed"] = s.seed
    return out


def generate_body(
    rid: int,
    ids: list[int],
    sampling: SamplingParams,
    bootstrap: tuple[str, int] | None,
    stream: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "rid": str(rid),
        "input_ids": ids,
        "sampling_params": sampling_params(sampling),
        "stream": stream,
    }
    if sampling.wants_logprobs:
        body["return_logprob"] = True
        body["top_logprobs_num"] = sampling.top_logprobs
    if bootstrap is not None:
        body["bootstrap_host"], body["bootstrap_port"] = bootstrap
        body["bootstrap_room"] = rid
    return body


_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


def finish_reason(meta: dict[str, Any]) -> FinishReason | None:
    """SGLang's ``meta_info.finish_reason`` (``{"type": ...}`` or None while running)."""
    fr = meta.get("finish_reason")
    if not fr:
        return None
    kind = fr.get("type") if isinstance(fr, dict) else str(fr)
    if kind == "abort":
        raise RuntimeError(f"SGLang aborted the request: {fr.get('message', '')}")
    return _FINISH.get(str(kind), "stop")


def new_tokens(chunk: dict[str, Any], seen: int) -> list[SampledToken]:
    """Tokens of a (cumulative) streamed or final answer after the first ``seen``; the last
    carries SGLang's finish reason when the request ended there."""
    ids: list[int] = list(chunk.get("output_ids") or [])[seen:]
    meta = chunk.get("meta_info") or {}
    lps = (meta.get("output_token_logprobs") or [])[seen:]
    tops = (meta.get("output_top_logprobs") or [])[seen:]
    out = []
    for k, tid in enumerate(ids):
        lp = float(lps[k][0]) if k < len(lps) and lps[k] else None
        top: tuple[tuple[int, float], ...] = ()
        if k < len(tops) and tops[k]:
            top = tuple((int(t[1]), float(t[0])) for t in tops[k])
        out.append(SampledToken(int(tid), lp, top))
    reason = finish_reason(meta)
    if out and reason is not None:
        last = out[-1]
        out[-1] = SampledToken(last.id, last.logprob, last.top, reason)
    return out
