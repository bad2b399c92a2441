"""Role switches under load: N in-place switches in both directions while requests flow.

Loses no request if every request either completes or ends with a clear error, and none
hangs. Switch times come from each sidecar's own record of its last switch (drain start to
Active in the new role)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from fluidpd.drills.admin import admin_session, get_json, router_workers
from fluidpd.drills.load import OpenLoopLoad


async def _workers(session: aiohttp.ClientSession, endpoint: str) -> dict[str, dict[str, Any]]:
    return {w["worker"]: w for w in await router_workers(session, endpoint)}


async def switch_once(
    session: aiohttp.ClientSession,
    endpoint: str,
    token: str | None,
    source: str,
    drain: str,
    timeout_s: float = 60.0,
    pool_wait_s: float = 10.0,
) -> dict[str, Any] | None:
    """Switches one Active worker of role ``source`` (the least loaded); waits for Active.

    None when the role never has two Active healthy workers within ``pool_wait_s``: the
    router's view of the worker switched last can lag its finish by a poll, and read then,
    the drill skipped a switch on a loaded machine."""
    deadline = time.time() + pool_wait_s
    while True:
        workers = await _workers(session, endpoint)
        pool = [w for w in workers.values()
                if w["role"] == source and w["state"] == "active" and w["healthy"]]  # fmt: skip
        if len(pool) >= 2:
            break
        if time.time() >= deadline:
            return None
        await asyncio.sleep(0.1)
    victim = min(pool, key=lambda w: (w["batch"] + w["queue_len"], w["worker"]))
    target = "decode" if source == "prefill" else "prefill"
    decode_urls = [
        w["url"] for w in workers.values()
        if w["role"] == "decode" and w["state"] == "active" and w["worker"] != victim["worker"]
    ]  # fmt: skip
    headers = {"content-type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"role": target, "drain": drain, "migrate_to": decode_urls}
    t0 = time.time()
    async with session.post(f"{victim['url']}/role", data=orjson.dumps(body), headers=headers) as r:
        if r.status != 200:
            return {"worker": victim["worker"], "error": f"HTTP {r.status}: {await r.text()}"}
    before = (await get_json(session, f"{victim['url']}/pressure"))["switches"]
    while time.time() - t0 < timeout_s:
        p = await get_json(session, f"{victim['url']}/pressure")
        if p["switches"] > before or (p["state"] == "active" and p["role"] == target):
            return {
                "worker": victim["worker"],
                "from": source,
                "to": target,
                "drain": drain,
                "switch_s": round(p["last_switch_finished"] - p["last_switch_started"], 3),
            }
        await asyncio.sleep(0.05)
    return {
        "worker": victim["worker"],
        "from": source,
        "to": target,
        "drain": drain,
        "error": "timeout",
    }


async def switch_drill(
    endpoint: str,
    token: str | None,
    model: str,
    n_switches: int = 20,
    rps: float = 8.0,
    drains: tuple[str, ...] = ("wait", "migrate"),
    settle_s: float = 1.0,
    hang_s: float = 120.0,
    seed: int = 0,
) -> dict[str, Any]:
    load = OpenLoopLoad(endpoint, model, rps, seed=seed, request_timeout_s=hang_s)
    stop = asyncio.Event()
    load_task = asyncio.create_task(load.run(10_000, stop))
    switches: list[dict[str, Any]] = []
    async with admin_session(token) as session:
        await asyncio.sleep(3.0)  # let load build up on every worker
        for i in range(n_switches):
            # Alternate directions; D->P switches cycle through the drain modes.
            source = "prefill" if i % 2 == 0 else "decode"
            drain = "wait" if source == "prefill" else drains[(i // 2) % len(drains)]
            result = await switch_once(session, endpoint, token, source, drain)
            if result is not None:
                switches.append(result)
            await asyncio.sleep(settle_s)
    stop.set()
    report = await load_task
    by_kind: dict[str, list[float]] = {}
    for s in switches:
        if "switch_s" in s:
            key = "P->D" if s["from"] == "prefill" else f"D->P ({s['drain']})"
            by_kind.setdefault(key, []).append(s["switch_s"])
    return {
        "switches": switches,
        "switch_times": {
            k: {"n": len(v), "max_s": max(v), "mean_s": round(sum(v) / len(v), 3)}
            for k, v in by_kind.items()
        },
        "requests": report.summary(hang_s),
    }
