"""Router overhead: the same requests through the router and straight to a sidecar pair (the
client does the router's two-halves protocol itself), interleaved in one run.

Prompts are token ids (the router only checks them) or text (the router tokenizes it with the
served model's tokenizer; the direct path sends the ids the client tokenized beforehand, so
the difference includes tokenization)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import aiohttp
import orjson

from fluidpd.api.sampling import SamplingParams
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.synthetic import corpus
from fluidpd.modeldir.text import load_tokenizer

_SAMPLING = SamplingParams(max_new_tokens=2, temperature=0.0).model_dump()


def drill_prompt(length: int, model_dir: str | None = None) -> tuple[str, list[int]]:
    """A text prompt of about ``length`` tokens of the served model and its token ids."""
    tok = load_tokenizer(resolve_model_dir(model_dir))
    text = " ".join(corpus())
    while len(tok.encode(text).ids) < length:
        text += " " + text
    text = tok.decode(tok.encode(text, add_special_tokens=False).ids[: max(1, length - 1)])
    return text, list(tok.encode(text).ids)


async def _via_router(
    session: aiohttp.ClientSession, endpoint: str, model: str, prompt: str | list[int]
) -> float:
    t0 = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    async with session.post(
        f"{endpoint}/v1/completions", data=orjson.dumps(body),
        headers={"content-type": "application/json"},
    ) as resp:  # fmt: skip
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"router HTTP {resp.status}")
    return time.perf_counter() - t0


async def _direct(
    session: aiohttp.ClientSession,
    prefill: str,
    decode: str,
    headers: dict[str, str],
    ids: list[int],
) -> float:
    t0 = time.perf_counter()
    rid = random.getrandbits(62)
    arrival = time.time()
    half = {"rid": rid, "prompt_ids": ids, "sampling": _SAMPLING, "arrival": arrival}
    dec = {**half, "prefill_worker": "p", "prefill_url": prefill}
    pre = {**half, "decode_worker": "d", "decode_url": decode}
    async with session.post(
        f"{decode}/v1/internal/decode", data=orjson.dumps(dec), headers=headers
    ) as d:
        pre_task = asyncio.ensure_future(
            session.post(f"{prefill}/v1/internal/prefill", data=orjson.dumps(pre), headers=headers)
        )
        async for line in d.content:
            kind = orjson.loads(line)["event"]
            if kind == "done":
                await d.content.read()  # the router does the same: keep the connection
                break
            if kind != "token":  # the router would re-pair it; here it is an error
                pre_task.cancel()
                raise RuntimeError(f"decode half: {kind}")
        (await pre_task).release()
    return time.perf_counter() - t0


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50_ms": round(1e3 * statistics.median(xs), 3),
        "p99_ms": round(1e3 * xs[int(0.99 * (len(xs) - 1))], 3),
        "mean_ms": round(1e3 * statistics.fmean(xs), 3),
    }


async def router_overhead(
    endpoint: str,
    model: str,
    prefill_url: str,
    decode_url: str,
    token: str | None,
    rps: float = 200.0,
    duration_s: float = 20.0,
    prompt_len: int = 16,
    seed: int = 0,
    prompt_format: str = "ids",
    model_dir: str | None = None,
) -> dict[str, Any]:
    """Alternates router and direct requests at ``rps`` in total (open loop)."""
    rng = random.Random(seed)
    text, ids = drill_prompt(prompt_len, model_dir)
    if prompt_format == "ids":
        ids = [rng.randrange(300, 1000) for _ in range(prompt_len)]
    prompt: str | list[int] = text if prompt_format == "text" else ids
    headers = {"content-type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    router: list[float] = []
    direct: list[float] = []
    errors = 0

    async def one(via_router: bool, session: aiohttp.ClientSession) -> None:
        nonlocal errors
        try:
            if via_router:
                router.append(await _via_router(session, endpoint, model, prompt))
            else:
                direct.append(await _direct(session, prefill_url, decode_url, headers, ids))
        except (aiohttp.ClientError, RuntimeError, ValueError):
            errors += 1

    tasks: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for warm in range(20):  # warm both paths' connection pools
            await one(warm % 2 == 0, session)
        router.clear()
        direct.clear()
        t_end = time.time() + duration_s
        i = 0
        while time.time() < t_end:
            tasks.append(asyncio.create_task(one(i % 2 == 0, session)))
            i += 1
            await asyncio.sleep(rng.expovariate(rps))
        await asyncio.wait(tasks)
    if len(router) < 10 or len(direct) < 10:
        raise RuntimeError(
            f"too few requests succeeded to compare ({len(router)} via the router, "
            f"{len(direct)} direct, {errors} errors): is the stack healthy?"
        )
    r, d = _stats(router), _stats(direct)
    return {
        "rps": rps,
        "duration_s": duration_s,
        "prompt_format": prompt_format,
        "prompt_tokens": len(ids),
        "router": r,
        "direct": d,
        "added_p50_ms": round(r["p50_ms"] - d["p50_ms"], 3),
        "added_p99_ms": round(r["p99_ms"] - d["p99_ms"], 3),
        "errors": errors,
    }
