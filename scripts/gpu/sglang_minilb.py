"""Plain SGLang P/D behind a minimal load balancer: the baseline FluidPD-on-SGLang is measured
against (scripts/gpu/sglang_overhead.py, scripts/gpu/sglang_live.py).

SGLang's own ``mini_lb`` lives in the ``sglang-router`` package since 0.5, which is not among
the wheels staged for the H200 (scripts/gpu/sglang_bundles.sh), and SGLang 0.5.17's wheel has
no ``srt/disaggregation/mini_lb.py``. This is the same protocol, written for the benchmark:
per request it draws one prefill and one decode SGLang server at random (as mini_lb does),
adds SGLang's bootstrap triple (the prefill server's host and bootstrap port, a random 63-bit
``bootstrap_room``), posts the request to both at once (``/generate``) and streams the decode
server's answer. No FluidPD code is on the request path.

It speaks the OpenAI completions API that ``fluidpd replay`` and the benchmarks send (token-id
prompts, streaming with usage), because SGLang runs with ``--skip-tokenizer-init`` under
FluidPD's sidecars: each streamed chunk's text is the new token ids written out (``<id>``),
not detokenized text. FluidPD's decode sidecar detokenizes; this does not, so any cost of that
counts against FluidPD in the comparison.

usage: python3 sglang_minilb.py --port P --prefill SGLANG_URL,BOOTSTRAP_HOST,BOOTSTRAP_PORT
       [--prefill ...] --decode SGLANG_URL [--decode ...] [--model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "ignore_eos": "ignore_eos",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "stop_token_ids": "stop_token_ids",
}


class MiniLB:
    def __init__(self, prefill: list[tuple[str, str, int]], decode: list[str], model: str) -> None:
        self.prefill = prefill
        self.decode = decode
        self.model = model
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )
        self.served = 0

    def bodies(self, req: dict[str, Any]) -> tuple[str, dict[str, Any], str, dict[str, Any]]:
        prompt = req.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt: this balancer takes token ids (a list of ints)")
        sampling: dict[str, Any] = {"max_new_tokens": int(req.get("max_tokens") or 16)}
        for k, v in _SAMPLING.items():
            if k in req and req[k] is not None:
                sampling[v] = req[k]
        p_url, host, port = random.choice(self.prefill)
        d_url = random.choice(self.decode)
        rid = uuid.uuid4().hex
        body = {
            "rid": rid,
            "input_ids": prompt,
            "sampling_params": sampling,
            "bootstrap_host": host,
            "bootstrap_port": port,
            "bootstrap_room": random.randrange(1 << 63),
        }
        return p_url, {**body, "stream": False}, d_url, {**body, "stream": True}

    def chunk(self, cid: str, text: str, finish: str | None) -> bytes:
        obj = {
            "id": cid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def stream(self, req: dict[str, Any]) -> AsyncIterator[bytes]:
        p_url, p_body, d_url, d_body = self.bodies(req)
        cid = f"cmpl-{d_body['rid']}"
        prefill = asyncio.ensure_future(self.client.post(f"{p_url}/generate", json=p_body))
        seen, finish = 0, None
        try:
            async with self.client.stream("POST", f"{d_url}/generate", json=d_body) as r:
                if r.status_code != 200:
                    detail = (await r.aread()).decode(errors="replace")[:300]
                    yield b"data: " + json.dumps({"error": detail}).encode() + b"\n\n"
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    ids = list(obj.get("output_ids") or [])
                    fr = (obj.get("meta_info") or {}).get("finish_reason")
                    if fr:
                        finish = fr.get("type") if isinstance(fr, dict) else str(fr)
                    if len(ids) > seen:  # SGLang streams the cumulative output
                        text = "".join(f"<{t}>" for t in ids[seen:])
                        seen = len(ids)
                        yield self.chunk(cid, text, None)
            await prefill
            yield self.chunk(cid, "", "length" if finish == "length" else "stop")
            if (req.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": len(d_body["input_ids"]),
                    "completion_tokens": seen,
                    "total_tokens": len(d_body["input_ids"]) + seen,
                }
                obj = {"id": cid, "object": "text_completion", "model": self.model,
                       "choices": [], "usage": usage}  # fmt: skip
                yield b"data: " + json.dumps(obj).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            self.served += 1
        finally:
            if not prefill.done():
                prefill.cancel()


def build(lb: MiniLB) -> Starlette:
    async def completions(request: Request) -> Response:
        try:
            req = await request.json()
            lb.bodies(req)  # validate before answering 200
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=400)
        if req.get("stream"):
            return StreamingResponse(lb.stream(req), media_type="text/event-stream")
        text, n = "", 0
        async for part in lb.stream({**req, "stream_options": {"include_usage": True}}):
            if part.startswith(b"data: {"):
                obj = json.loads(part[6:])
                if obj.get("choices"):
                    text += obj["choices"][0]["text"]
                if obj.get("usage"):
                    n = obj["usage"]["completion_tokens"]
        return JSONResponse({
            "object": "text_completion", "model": lb.model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"completion_tokens": n},
        })  # fmt: skip

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": lb.model, "object": "model"}]})

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True, "served": lb.served})

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/healthz", health),
        Route("/health", health),
    ])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", action="append", required=True,
                   help="SGLANG_URL,BOOTSTRAP_HOST,BOOTSTRAP_PORT")  # fmt: skip
    p.add_argument("--decode", action="append", required=True, help="SGLANG_URL")
    p.add_argument("--model", default="llama-3.1-8b")
    a = p.parse_args()
    prefill = []
    for spec in a.prefill:
        url, host, port = spec.split(",")
        prefill.append((url.rstrip("/"), host, int(port)))
    lb = MiniLB(prefill, [d.rstrip("/") for d in a.decode], a.model)
    uvicorn.run(build(lb), host=a.host, port=a.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools", timeout_keep_alive=75)  # fmt: skip


if __name__ == "__main__":
    main()
