"""A worker killed with SIGKILL under load: how fast the router stops using it, and what
happens to the requests it held."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from fluidpd.drills.admin import admin_session, router_workers
from fluidpd.drills.load import OpenLoopLoad


async def _healthy(session: aiohttp.ClientSession, endpoint: str, worker: str) -> bool | None:
    for w in await router_workers(session, endpoint):
        if w["worker"] == worker:
            return bool(w["healthy"])
    return None


def _log_time(line: str) -> float:
    """Seconds since the epoch of a logging line's default timestamp (local time, ms)."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return 0.0


async def busiest_decode(session: aiohttp.ClientSession, endpoint: str) -> str:
    """The decode worker with the most active requests right now."""
    workers = await router_workers(session, endpoint)
    decode = [w for w in workers if w["role"] == "decode" and w["healthy"]]
    return str(max(decode, key=lambda w: (w["batch"], w["worker"]))["worker"])


async def kill_drill(
    endpoint: str,
    model: str,
    worker: str | None,
    pids: dict[str, int],
    rps: float = 8.0,
    before_s: float = 5.0,
    after_s: float = 10.0,
    hang_s: float = 120.0,
    seed: int = 0,
    controller_log: Path | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    load = OpenLoopLoad(endpoint, model, rps, seed=seed, request_timeout_s=hang_s)
    stop = asyncio.Event()
    load_task = asyncio.create_task(load.run(10_000, stop))
    async with admin_session(token) as session:
        await asyncio.sleep(before_s)
        worker = worker or await busiest_decode(session, endpoint)
        in_flight = [o for o in load.report.outcomes if not o.end]
        killed = time.time()
        os.kill(pids[worker], signal.SIGKILL)
        dropped: float | None = None
        while time.time() - killed < 10.0:
            if await _healthy(session, endpoint, worker) is False:
                dropped = time.time() - killed
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(after_s)
    stop.set()
    report = await load_task
    after = [o for o in report.outcomes if o.start > killed + (dropped or 0.0) + 0.5]
    switched_dead = None
    if controller_log is not None:
        # The controller names every worker it switches in its log; none may be the dead one.
        switched_dead = any(
            f"switch {worker} " in line and _log_time(line) >= killed
            for line in controller_log.read_text().splitlines()
        )
    return {
        "worker": worker,
        "in_flight_at_kill": len(in_flight),
        "killed_at": killed,
        "controller_switched_dead_worker": switched_dead,
        "router_dropped_after_s": None if dropped is None else round(dropped, 3),
        "requests": report.summary(hang_s),
        "requests_started_after_drop": {
            "sent": len(after),
            "completed": sum(1 for o in after if o.ok),
        },
    }
