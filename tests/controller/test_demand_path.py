"""The live controller runs the predictive rule on the router's arrivals, in process: the
arrivals reach the core's demand window (``RoleControl``, the simulator's feed), a mismatched
split is switched with its forecast, a matched one is declined, and an interval whose arrivals
did not come takes no predictive switch. ``DemandFeed`` reads a router's log in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fluidpd.api.demand import ArrivalRecord, ArrivalsReport
from fluidpd.controller.demand import DemandFeed, RouterDemand
from fluidpd.controller.loop import FluidRoleController
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.profile import Profile
from fluidpd.core.role_control import Arrival
from fluidpd.core.types import SLO, DrainMode, Role
from fluidpd.profiles import resolve_profile
from tests.local_http import serve_routes

SLO_ = SLO(2.0, 0.1)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return resolve_profile("llama-3.1-8b", "a100-80gb", None)


class FakeFeed:
    """Arrivals at ``rate`` over the last ``span`` seconds on the first read, none after; or
    no answer at all (``answers=False``)."""

    def __init__(self, rate: float, prompt: int, output: int, span: float = 10.0,
                 answers: bool = True) -> None:  # fmt: skip
        self.rate, self.prompt, self.output, self.span = rate, prompt, output, span
        self.answers = answers
        self.reads = 0

    async def read(self) -> list[Arrival] | None:
        self.reads += 1
        if not self.answers:
            return None
        if self.reads > 1:
            return []
        now, n = time.time(), int(self.rate * self.span)
        return [
            Arrival(now - self.span + i / self.rate, self.prompt, self.output) for i in range(n)
        ]


class Controller(FluidRoleController):
    """Pressure reports from a script; switch requests recorded, always accepted."""

    def __init__(self, fleet: dict[str, tuple[Role, float]], **kw: Any) -> None:
        async def source() -> dict[str, str]:
            return {w: f"http://{w}" for w in fleet}

        unused: Any = None
        super().__init__(source, kw.pop("cfg"), unused, **kw)
        self.fleet = fleet
        self.posted: list[tuple[str, Role, DrainMode]] = []

    async def _pressure(self, wid: str, url: str) -> dict[str, Any] | None:
        role, ppi = self.fleet[wid]
        return {
            "worker": wid, "url": url, "role": role.value, "state": "active",
            "attributable_ppi": ppi if role is Role.PREFILL else 0.0,
            "dpi_load": 0.05 if role is Role.DECODE else 0.0,
            "dpi_adm": 0.05 if role is Role.DECODE else 0.0, "drain_cost": 0.0,
        }  # fmt: skip

    async def _post_role(self, worker: str, target: Role, drain: DrainMode) -> tuple[bool, str]:
        self.posted.append((worker, target, drain))
        return True, ""


def _fleet(n_p: int, n_d: int, ppi: float) -> dict[str, tuple[Role, float]]:
    roles = [Role.PREFILL] * n_p + [Role.DECODE] * n_d
    return {f"w{i}": (r, ppi) for i, r in enumerate(roles)}


def _run(ctl: Controller, steps: int) -> None:
    async def go() -> None:
        for _ in range(steps):
            await ctl.step()

    asyncio.run(go())


def test_a_mismatched_split_is_switched_on_the_forecast(profile: Profile) -> None:
    feed = FakeFeed(12.0, 4500, 8)  # far beyond one prefill worker
    ctl = Controller(_fleet(1, 3, 3.0), cfg=FluidRoleConfig(n_persist=2, window_s=2.0),
                     profile=profile, slo=SLO_, demand=feed)  # fmt: skip
    assert ctl.role.predictive
    _run(ctl, 3)
    started = [e for e in ctl.events if e.kind == "switch-started"]
    assert len(started) == 1 and ctl.posted[0][1] is Role.PREFILL
    assert (started[0].detail["from"], started[0].detail["to"]) == ("decode", "prefill")
    forecast = started[0].detail["forecast"]
    assert forecast["gain"] > forecast["cost"] and forecast["after"] < forecast["before"]
    assert forecast["gain_at_rate"] > forecast["cost_at_rate"]
    # The decode donor left at the window's rate: two of three workers carry the streams.
    assert 0.0 < forecast["donor_at_rate"] < 1.0
    assert ctl.role.last_demand is not None and ctl.role.last_demand.prompt == 4500


def test_a_matched_split_is_declined(profile: Profile) -> None:
    # A low PPI threshold makes eq. (22) propose; two prefill workers carry the demand.
    cfg = FluidRoleConfig(n_persist=2, window_s=2.0, ppi_low=0.05, ppi_high=0.05)
    feed = FakeFeed(2.0, 1500, 8, span=30.0)
    ctl = Controller(_fleet(2, 2, 0.5), cfg=cfg, profile=profile, slo=SLO_,
                     demand=feed)  # fmt: skip
    _run(ctl, 4)
    kinds = [e.kind for e in ctl.events]
    assert "switch-started" not in kinds and not ctl.posted
    declined = [e for e in ctl.events if e.kind == "switch-declined"]
    assert declined and declined[0].detail["gain"] == 0.0
    # Nor is there a gain at the window's rate itself (the lower bound is not all it read).
    assert declined[0].detail["gain_at_rate"] == 0.0
    assert declined[0].detail["direction"] == "decode->prefill"
    # The paper rule, on the same pressure, switches.
    paper = Controller(_fleet(2, 2, 0.5), cfg=cfg)
    assert not paper.role.predictive
    _run(paper, 2)
    assert paper.posted


def test_no_predictive_switch_while_the_router_gives_no_arrivals(profile: Profile) -> None:
    feed = FakeFeed(12.0, 4500, 8, answers=False)
    ctl = Controller(_fleet(1, 3, 3.0), cfg=FluidRoleConfig(n_persist=1, window_s=1.0),
                     profile=profile, slo=SLO_, demand=feed)  # fmt: skip
    _run(ctl, 3)
    assert feed.reads == 3 and not ctl.posted and not ctl.events


async def _serve(arrivals: Any) -> tuple[web.AppRunner, str]:
    return await serve_routes([web.get("/admin/arrivals", arrivals)])


#: A read timeout no local answer should reach, even on a loaded shared machine.
SLOW_MACHINE_S = 30.0


def _report(epoch: str, nxt: int, prompts: list[int], t: float) -> bytes:
    records = [ArrivalRecord(t=t - 1.0, prompt=p, output=4) for p in prompts]
    body = ArrivalsReport(epoch=epoch, t=t, next=nxt, dropped=0, arrivals=records)
    return body.model_dump_json().encode()


def test_feed_reads_after_its_cursor_and_starts_over_with_a_new_router() -> None:
    seen: list[dict[str, str]] = []
    answers: list[bytes | int] = []

    async def arrivals(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        assert request.headers.get("Authorization") == "Bearer t"
        answer = answers.pop(0)
        if isinstance(answer, int):
            return web.Response(status=answer)
        return web.Response(body=answer, content_type="application/json")

    async def go() -> list[list[Arrival] | None]:
        runner, url = await _serve(arrivals)
        # The router's clock runs 100 s ahead of ours: arrivals come back on ours.
        ahead = time.time() + 100.0
        answers.extend([
            _report("a", 2, [10, 20], ahead), _report("a", 3, [30], ahead), 500,
            _report("b", 1, [40], ahead),
        ])  # fmt: skip
        out = []
        async with aiohttp.ClientSession() as session:
            # What is checked is the cursor, not the latency: a read that timed out on a busy
            # machine (after the server took its answer) would shift every later one.
            feed = DemandFeed(session, url, {"Authorization": "Bearer t"},
                              timeout_s=SLOW_MACHINE_S)  # fmt: skip
            for _ in range(4):
                out.append(await feed.read())
            assert (feed.epoch, feed.cursor, feed.received) == ("b", 1, 4)
        await runner.cleanup()
        return out

    out = asyncio.run(go())
    assert seen == [{}, {"after": "2", "epoch": "a"}, {"after": "3", "epoch": "a"},
                    {"after": "3", "epoch": "a"}]  # fmt: skip
    first, second, failed, restarted = out
    assert failed is None
    assert first is not None and [a.prompt for a in first] == [10, 20]
    assert second is not None and restarted is not None
    assert [a.prompt for a in second + restarted] == [30, 40]
    assert abs(first[0].t - (time.time() - 1.0)) < 5.0


def test_a_read_past_its_timeout_is_incomplete_and_keeps_the_cursor() -> None:
    release = asyncio.Event()

    async def arrivals(request: web.Request) -> web.Response:
        if "after" not in request.query:
            return web.Response(body=_report("a", 1, [10], time.time()),
                                content_type="application/json")  # fmt: skip
        await release.wait()  # answers only after the client has given up
        return web.Response(body=_report("a", 2, [20], time.time()),
                            content_type="application/json")  # fmt: skip

    async def go() -> tuple[list[Arrival] | None, list[Arrival] | None]:
        runner, url = await _serve(arrivals)
        async with aiohttp.ClientSession() as session:
            feed = DemandFeed(session, url, timeout_s=SLOW_MACHINE_S)
            first = await feed.read()
            # Only the read that cannot be answered is short of time: a loaded machine must not
            # time out the first one too.
            feed.timeout = aiohttp.ClientTimeout(total=0.2)
            late = await feed.read()
            release.set()
            assert (feed.epoch, feed.cursor, feed.received) == ("a", 1, 1)
        await runner.cleanup()
        return first, late

    first, late = asyncio.run(go())
    assert first is not None and [a.prompt for a in first] == [10]
    assert late is None


def test_router_demand_merges_every_routers_arrivals_in_time_order() -> None:
    # Two router replicas behind one Service: each logs only the requests sent to it.
    logs: dict[int, list[tuple[float, int]]] = {}
    down: set[int] = set()

    def handler(idx: int) -> Any:
        async def arrivals(request: web.Request) -> web.Response:
            assert request.headers.get("Authorization") == "Bearer t"
            if idx in down:
                return web.Response(status=503)
            after = int(request.query.get("after", "-1"))
            now = time.time()
            got = [(i, t, p) for i, (t, p) in enumerate(logs[idx]) if i > after]
            records = [ArrivalRecord(t=now - t, prompt=p, output=4) for _, t, p in got]
            body = ArrivalsReport(
                epoch=f"r{idx}", t=now, next=len(logs[idx]) - 1, dropped=0, arrivals=records
            )
            return web.Response(body=body.model_dump_json(), content_type="application/json")

        return arrivals

    async def go() -> list[list[Arrival] | None]:
        runners, urls = [], []
        for idx in (0, 1):
            runner, url = await _serve(handler(idx))
            runners.append(runner)
            urls.append(url)
        # (seconds ago, prompt): interleaved in time across the two routers.
        logs[0] = [(5.0, 10), (3.0, 30)]
        logs[1] = [(4.0, 20), (2.0, 40)]
        ready = list(urls)
        out = []
        async with aiohttp.ClientSession() as session:
            demand = RouterDemand(session, lambda: ready, lambda: {"Authorization": "Bearer t"},
                                  timeout_s=SLOW_MACHINE_S)  # fmt: skip
            out.append(await demand.read())
            logs[1].append((1.0, 50))
            down.add(0)
            out.append(await demand.read())  # one router did not answer: incomplete
            down.clear()
            out.append(await demand.read())
            ready.pop(0)  # router 0 left: only router 1 is read
            logs[0].append((0.5, 60))
            logs[1].append((0.2, 70))
            out.append(await demand.read())
            ready.clear()
            out.append(await demand.read())
        for runner in runners:
            await runner.cleanup()
        return out

    first, failed, second, third, none = asyncio.run(go())
    assert first is not None and [a.prompt for a in first] == [10, 20, 30, 40]
    assert [a.t for a in first] == sorted(a.t for a in first)
    assert failed is None and none is None
    # Router 1's arrival of the incomplete read is kept for the next complete one.
    assert second is not None and [a.prompt for a in second] == [50]
    assert third is not None and [a.prompt for a in third] == [70]
