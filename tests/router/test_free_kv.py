"""The router's least-loaded pairing: a decode worker's free KV through the core's eq. (6), and
what was routed to a worker since its last report counted until a report shows it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

import aiohttp
from aiohttp import web

from fluidpd.core.signals import allocatable_kv
from fluidpd.core.types import Role, RoleState
from fluidpd.router.app import _free_kv, _worker_set
from fluidpd.router.config import RouterConfig
from fluidpd.router.workers import REPORTED_AFTER_S, WorkerSet


def test_free_kv_is_eq6_of_the_last_report() -> None:
    report = {"kv_capacity": 1000, "kv_used": 300, "kv_reserved": 200, "queue_len": 4}
    assert _free_kv(report) == allocatable_kv(1000, 300, 200) == 500
    assert _free_kv({}) == 0.0  # a worker not polled yet offers nothing


def _least_loaded(reports: dict[str, tuple[Role, dict[str, float]]]) -> WorkerSet:
    cfg = RouterConfig(
        model="m", context_limit=4096, pairing="least-loaded",
        workers={w: f"http://127.0.0.1:1/{w}" for w in reports},
    )  # fmt: skip
    workers = _worker_set(cfg)
    for wid, (role, report) in reports.items():  # what a poll would have seen
        info = workers.workers[wid]
        info.role, info.state, info.healthy, info.pressure = role, RoleState.ACTIVE, True, report
    return workers


def test_a_burst_between_two_polls_is_spread_by_what_was_routed() -> None:
    decode = {"kv_capacity": 20_000, "kv_used": 0, "kv_reserved": 0}
    workers = _least_loaded(
        {
            "p0": (Role.PREFILL, {"queue_len": 0}),
            "p1": (Role.PREFILL, {"queue_len": 2}),
            "d0": (Role.DECODE, dict(decode)),
            "d1": (Role.DECODE, dict(decode, kv_used=1_000)),
        }
    )
    picks = []
    for _ in range(8):
        pair = workers.choose(prompt_tokens=2_000)
        assert pair is not None
        picks.append((pair[0].worker, pair[1].worker))
    # d1 reported 1,000 tokens less free KV; after that the 2,000-token prompts alternate.
    assert Counter(d for _, d in picks) == {"d0": 4, "d1": 4}
    assert picks[0][1] == "d0"
    # p1 reported two queued; p0 takes the first two, then they alternate.
    assert [p for p, _ in picks[:2]] == ["p0", "p0"]
    assert Counter(p for p, _ in picks) == {"p0": 5, "p1": 3}
    assert workers.workers["d0"].unreported_tokens == 8_000


def test_a_report_asked_for_after_a_request_was_routed_takes_over_its_count() -> None:
    workers = WorkerSet()
    workers.set({"d0": "http://127.0.0.1:1"})
    info = workers.workers["d0"]
    info.routed(500, now=100.0)
    info.routed(700, now=100.5)
    info.reported(poll_started=100.0 + REPORTED_AFTER_S)  # shows the first, maybe not the second
    assert info.unreported == [(100.5, 700)]
    info.reported(poll_started=100.5)  # too soon after the second for its report to show it
    assert info.unreported_tokens == 700
    info.reported(poll_started=101.0)
    assert info.unreported_tokens == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_poll_of_a_live_worker_clears_what_its_report_shows() -> None:
    async def main() -> None:
        async def pressure(_r: web.Request) -> web.Response:
            return web.json_response({"role": "decode", "state": "active", "kv_capacity": 10})

        app = web.Application()
        app.router.add_get("/pressure", pressure)
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            workers = WorkerSet()
            workers.set({"d0": f"http://127.0.0.1:{port}"})
            info = workers.workers["d0"]
            info.routed(300, now=time.time() - 2 * REPORTED_AFTER_S)
            info.routed(400, now=time.time() + 60.0)  # routed "after" the poll below starts
            async with aiohttp.ClientSession() as session:
                await workers.start(session)
                await workers.wait_polled(10.0)
                await workers.stop()
            assert info.healthy and info.role is Role.DECODE
            assert info.unreported_tokens == 400
        finally:
            await runner.cleanup()

    asyncio.run(main())
