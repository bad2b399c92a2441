"""Router overhead: the same small requests through the router and straight to a sidecar pair
(the client does the router's two-halves protocol itself), interleaved in one run."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import aiohttp
import orjson


async def _via_router(session: aiohttp.ClientSession, endpoint: str, model: str, n: int) -> float:
    t0 = time.perf_counter()
    body = {"model": model, "prompt": [5] * n, "max_tokens": 2}
    async with session.post(
        f"{endpoint}/v1/completions", data=orjson.dumps(body),
        headers={"content-type": "application/json"},
    ) as resp:  # fmt: skip
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"router HTTP {resp.status}")
    return time.perf_counter() - t0


async def _direct(
    session: aiohttp.ClientSession, prefill: str, decode: str, headers: dict[str, str], n: int
) -> float:
    t0 = time.perf_counter()
    rid = random.getrandbits(62)
    arrival = time.time()
    half = {"rid": rid, "prompt_len": n, "max_new_tokens": 2, "arrival": arrival}
    dec = {**half, "prefill_worker": "p", "prefill_url": prefill}
    pre = {**half, "decode_worker": "d", "decode_url": decode}
    async with session.post(
        f"{decode}/v1/internal/decode", data=orjson.dumps(dec), headers=headers
    ) as d:
        pre_task = asyncio.ensure_future(
            session.post(f"{prefill}/v1/internal/prefill", data=orjson.dumps(pre), headers=headers)
        )
        async for line in d.content:
            if orjson.loads(line)["event"] == "done":
                await d.content.read()  # the router does the same: keep the connection
                break
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
) -> dict[str, Any]:
    """Alternates router and direct requests at ``rps`` in total (open loop)."""
    rng = random.Random(seed)
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
                router.append(await _via_router(session, endpoint, model, prompt_len))
            else:
                direct.append(await _direct(session, prefill_url, decode_url, headers, prompt_len))
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
        "router": r,
        "direct": d,
        "added_p50_ms": round(r["p50_ms"] - d["p50_ms"], 3),
        "added_p99_ms": round(r["p99_ms"] - d["p99_ms"], 3),
        "errors": errors,
    }
