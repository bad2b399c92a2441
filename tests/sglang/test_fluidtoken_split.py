"""FluidToken's split on the sglang engine without SGLang: the prefill planner (the core's
``PrefillSide``) deciding what SGLang's prefill server gets and telling the decode peer first,
the decode side's budget and pending suffix bookkeeping, and the hook's split registry.

The decode peer and the prefill hook are a small real HTTP server here (what they answer is
all the planner sees of them); the real ones run in test_sglang_shared_stack.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from fluidpd.api.internal import PrefillHalf, PrefillOutcome, PressureReport
from fluidpd.api.sampling import SamplingParams
from fluidpd.core.fluidtoken import FluidTokenConfig, advertised_budget
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.types import SLO, Request, Role
from fluidpd.profiles import resolve_profile
from fluidpd_sidecar.peers import Peers
from fluidpd_sidecar.sglang import fluidtoken_hook
from fluidpd_sidecar.sglang.fluidtoken import DecodeSplits, PrefillPlanner
from tests.local_http import serve_routes

PROFILE = resolve_profile("llama-3.1-8b", "a100-80gb", None)
SLO_ = SLO(ttft=2.0, tpot=0.1)
CFG = FluidTokenConfig()


class Peer:
    """The decode sidecar's suffix route and the prefill hook's forget route, recording."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.log: list[tuple[str, Any]] = []

    async def suffix(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.log.append(("suffix", body))
        if self.refuse:
            return web.json_response({"detail": "no hook"}, status=400)
        return web.json_response({"budget": 123.0})

    async def forget(self, request: web.Request) -> web.Response:
        self.log.append(("forget", await request.json()))
        return web.json_response({"ok": True})


async def _serve(peer: Peer) -> tuple[web.AppRunner, str]:
    return await serve_routes(
        [web.post("/v1/internal/suffix", peer.suffix), web.post("/forget", peer.forget)]
    )


def _half(rid: int, n: int, url: str) -> PrefillHalf:
    return PrefillHalf(
        rid=rid,
        prompt_ids=list(range(100, 100 + n)),
        sampling=SamplingParams(max_new_tokens=4),
        arrival=time.time(),
        decode_worker="d0",
        decode_url=url,
    )


async def _run_planner(
    beta: float | None, n: int, refuse: bool = False
) -> tuple[PrefillOutcome, list[tuple[str, Any]], PrefillPlanner]:
    peer = Peer(refuse)
    runner, url = await _serve(peer)
    peers = Peers(None)

    async def call(half: PrefillHalf, ids: list[int]) -> PrefillOutcome:
        peer.log.append(("sglang", ids))
        return PrefillOutcome(status="done")

    async def abort(rid: int) -> None:
        peer.log.append(("abort", rid))

    planner = PrefillPlanner("p0", PROFILE, SLO_, CFG, beta, peers, call, abort, url)
    planner.start()
    try:
        out = await asyncio.wait_for(planner.prefill(_half(7, n, url)), 10)
    finally:
        await planner.stop()
        await peers.close()
        await runner.cleanup()
    return out, peer.log, planner


@pytest.mark.parametrize(("beta", "prefix"), [(0.0, 10), (0.5, 5), (0.3, 7)])
def test_planner_sends_sglang_only_the_prefix_after_telling_the_decode_peer(
    beta: float, prefix: int
) -> None:
    out, log, planner = asyncio.run(_run_planner(beta, 10))
    ids = list(range(100, 110))
    stolen = 10 - prefix
    expected: list[tuple[str, Any]] = [("sglang", ids[:prefix])]
    if stolen:
        # The split reaches the decode side before the prefill server may ship the prefix.
        # It carries the prefix the suffix extends (its extend attends over it).
        expected.insert(0, ("suffix", {"rid": 7, "tokens": stolen, "prefix": prefix}))
    assert log == expected
    assert out == PrefillOutcome(status="done", stolen=stolen)
    assert planner.stolen_tokens == stolen
    assert planner.budgets == ({"d0": 123.0} if stolen else {})
    assert not planner.side.waiting and planner.side.running is None


def test_beta_one_asks_no_prefill_server_and_forgets_the_room() -> None:
    out, log, _ = asyncio.run(_run_planner(1.0, 10))
    assert log == [("suffix", {"rid": 7, "tokens": 10, "prefix": 0}), ("forget", {"room": 7})]
    assert out == PrefillOutcome(status="done", stolen=10)


def test_a_split_the_decode_peer_did_not_take_is_prefilled_whole() -> None:
    # Safe either way: a decode side that did register it recomputes KV it already has.
    out, log, planner = asyncio.run(_run_planner(0.5, 10, refuse=True))
    split = {"rid": 7, "tokens": 5, "prefix": 5}
    assert log == [("suffix", split), ("sglang", list(range(100, 110)))]
    assert out == PrefillOutcome(status="done", stolen=0)
    assert planner.stolen_tokens == 0


class Engine:
    """SGLang's prefill server as the planner sees it: one call per request, answered when the
    test says so (its KV sent), and the hook's ``/forwarded`` long poll, answered once the test
    says the request's forward is done."""

    def __init__(self) -> None:
        self.started: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.forward: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.answer: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.log: list[tuple[str, int]] = []

    async def call(self, half: PrefillHalf, ids: list[int]) -> PrefillOutcome:
        self.log.append(("start", half.rid))
        self.started[half.rid].set()
        await self.answer[half.rid].wait()
        self.log.append(("answered", half.rid))
        return PrefillOutcome(status="done")

    async def forwarded(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            await asyncio.wait_for(self.forward[int(body["rid"])].wait(), float(body["timeout"]))
        except TimeoutError:
            return web.json_response({"forwarded": False})
        return web.json_response({"forwarded": True})


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _scripted(
    window: int, batching: bool = False
) -> AsyncIterator[tuple[Engine, PrefillPlanner, str]]:
    """A started planner over a scripted ``Engine`` (its hook's ``/forwarded`` served here).
    beta 0 forced: nothing stolen, so no suffix commit; every request is a whole prefill."""
    engine = Engine()
    app = web.Application()
    app.router.add_post("/forwarded", engine.forwarded)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    peers = Peers(None)

    async def abort(rid: int) -> None:
        return None

    planner = PrefillPlanner(
        "p0", PROFILE, SLO_, CFG, 0.0, peers, engine.call, abort, url, window=window,
        batching=batching,
    )  # fmt: skip
    planner.start()
    try:
        yield engine, planner, url
    finally:
        await planner.stop()
        await peers.close()
        await runner.cleanup()


async def _answer_all(
    engine: Engine, planner: PrefillPlanner, done: asyncio.Future[list[PrefillOutcome]]
) -> None:
    """Forwards and answers requests 1-3 in order; each was prefilled whole, and none is left
    in SGLang or in transfer."""
    for rid in (1, 2, 3):
        engine.answer[rid].set()
        engine.forward[rid].set()
        await asyncio.wait_for(engine.started[rid].wait(), 10)
    outcomes = await asyncio.wait_for(done, 10)
    assert outcomes == [PrefillOutcome(status="done", stolen=0)] * 3
    assert planner.in_flight == 0 and not planner.side.transfers


async def _pipeline(window: int) -> tuple[list[tuple[str, int]], PrefillPlanner]:
    """Three requests queued at once on a planner with ``window``; the test forwards and
    answers them one step at a time, and checks what is in SGLang at each step."""
    async with _scripted(window) as (engine, planner, url):
        halves = [planner.prefill(_half(rid, 10, url)) for rid in (1, 2, 3)]
        done = asyncio.gather(*halves)
        await asyncio.wait_for(engine.started[1].wait(), 10)
        engine.forward[1].set()  # request 1's forward done, its KV still in transfer
        await asyncio.wait_for(_until(lambda: planner.side.running is None or window > 1), 10)
        if window > 1:
            await asyncio.wait_for(engine.started[2].wait(), 10)
            # Both in SGLang: 1 sending its KV (the core's pending hand-off), 2 computing.
            assert planner.in_flight == 2
            assert 1 in planner.side.transfers
            assert planner.side.running is not None and planner.side.running.request.rid == 2
            engine.forward[2].set()
            await asyncio.wait_for(_until(lambda: planner.side.running is None), 10)
        else:
            assert not engine.started[2].is_set()  # waits for request 1's whole call
        await _answer_all(engine, planner, done)
    return engine.log, planner


def test_planner_releases_the_next_request_when_sglangs_forward_is_done() -> None:
    log, planner = asyncio.run(_pipeline(window=2))
    # 2 went in while 1's KV was in transfer; 3 only once 1 was answered (the window is 2).
    assert log[:3] == [("start", 1), ("start", 2), ("answered", 1)]
    assert log.index(("start", 3)) > log.index(("answered", 1))
    assert (planner.max_in_flight, planner.overlapped) == (2, 2)


def test_window_one_runs_each_requests_whole_call_before_the_next() -> None:
    log, planner = asyncio.run(_pipeline(window=1))
    assert log == [("start", 1), ("answered", 1), ("start", 2), ("answered", 2),
                   ("start", 3), ("answered", 3)]  # fmt: skip
    assert (planner.max_in_flight, planner.overlapped) == (1, 0)


async def _batched(window: int) -> tuple[list[tuple[str, int]], PrefillPlanner]:
    """Three requests queued at once on a batching planner: none stolen (beta 0), so each is
    handed to SGLang at once, up to the window, before any forward is done."""
    async with _scripted(window, batching=True) as (engine, planner, url):
        done = asyncio.gather(*(planner.prefill(_half(rid, 10, url)) for rid in (1, 2, 3)))
        await asyncio.wait_for(engine.started[2].wait(), 10)
        assert not engine.forward[1].is_set()  # 2 went in before 1's forward was done
        assert planner.side.running is None and {1, 2} <= set(planner.side.transfers)
        assert planner.side.handed_until > 0.0  # their predicted compute: the core's backlog
        assert not engine.started[3].is_set()  # the window (2) is full
        engine.answer[1].set()
        await asyncio.wait_for(engine.started[3].wait(), 10)
        await _answer_all(engine, planner, done)
    return engine.log, planner


def test_a_batching_planner_hands_sglang_what_it_steals_nothing_from_at_once() -> None:
    log, planner = asyncio.run(_batched(window=2))
    assert log[:3] == [("start", 1), ("start", 2), ("answered", 1)]
    assert (planner.max_in_flight, planner.overlapped) == (2, 2)


def test_hook_forwarded_long_poll_answers_once_marked(registry: None) -> None:
    assert not fluidtoken_hook.wait_forwarded("41", 0.0)
    fluidtoken_hook.mark_forwarded(["41"])
    assert fluidtoken_hook.wait_forwarded("41", 0.0)
    assert not fluidtoken_hook.wait_forwarded("41", 0.0)  # taken by the first waiter
    assert fluidtoken_hook.handle_post("/forwarded", {"rid": "41", "timeout": 0}) == (
        200, {"forwarded": False},
    )  # fmt: skip


def test_planner_queue_is_reported_as_bootstrap_entries() -> None:
    async def main() -> list[dict[str, Any]]:
        peers = Peers(None)

        async def call(half: PrefillHalf, ids: list[int]) -> PrefillOutcome:
            return PrefillOutcome(status="done")

        async def abort(rid: int) -> None:
            return None

        planner = PrefillPlanner("p0", PROFILE, SLO_, CFG, None, peers, call, abort, "http://x")
        req = Request(9, 5.0, 300, 4)
        req.decode_worker = "d0"
        planner.side.add(req)
        entries = planner.queue_entries()
        await peers.close()
        return entries

    assert asyncio.run(main()) == [{"rid": "9", "prompt_len": 300, "arrival": 5.0}]


def test_advertised_budget_is_the_decode_sides_own() -> None:
    w = Worker.create("d0", Role.DECODE, PROFILE, SLO_, CFG)
    d = w.decode
    for rid, (n, pending) in enumerate([(100, 0), (4000, 300)]):
        req = Request(rid, 0.0, n, 64)
        d.add(req)
        d.suffix_committed(rid, pending)
        d.handoff_done(rid, n, 0.0)
    d.next_batch(0.0)
    args = (SLO_.tpot, d.decode, d.suffix, len(d.active), d.context)
    assert d.steal_budget(2) == advertised_budget(*args, d.pending_suffixes(), d.dpi_load(), 2, CFG)
    assert advertised_budget(*args, (), d.dpi_load(), 2, CFG) >= d.steal_budget(2)
    assert advertised_budget(*args, (), d.dpi_load(), 2, CFG, admitting=False) == 0.0
    # Loaded past DPI_load^high: the gate of eq. (12) closes.
    assert advertised_budget(*args, (), CFG.dpi_load_high, 2, CFG) == 0.0


def _report(dpi: float) -> PressureReport:
    return PressureReport(
        worker="d0", role=Role.DECODE, state="active", queue_ppi=0.0, attributable_ppi=0.0,
        queue_len=0, dpi_load=dpi, dpi_adm=1.0, batch=0, kv_used=0, kv_reserved=0,
        kv_capacity=1000, steal_budget=0.0, drain_cost=0.0,
    )  # fmt: skip


def test_decode_budget_counts_registered_suffixes_until_the_hook_ran_them() -> None:
    splits = DecodeSplits(PROFILE, SLO_, CFG, "http://unused")
    t0 = time.time()
    splits.pending[5] = (400, 1600, t0)
    idle = {"decode_batch": 0, "decode_context": 0, "t": t0 + 1, "fluid_pending": ["5"]}
    full = advertised_budget(SLO_.tpot, splits.decode, splits.suffix, 0, 0, (), 0.0, 1, CFG)
    assert splits.pending_suffixes(idle) == [(400, 1600)]
    left = splits.budget(idle, _report(0.0), admitting=True)
    assert 0.0 < left < full
    assert left == advertised_budget(
        SLO_.tpot, splits.decode, splits.suffix, 0, 0, [(400, 1600)], 0.0, 1, CFG
    )
    # A snapshot from before the registration does not clear it; a later one without it does.
    assert splits.pending_suffixes({**idle, "fluid_pending": [], "t": t0 - 1}) == [(400, 1600)]
    assert splits.pending_suffixes({**idle, "fluid_pending": []}) == [] and not splits.pending
    assert splits.budget(idle, _report(0.0), admitting=True) == full > 0
    # Requests waiting for KV room here, or a worker draining: nothing to steal onto it.
    assert splits.budget({**idle, "prealloc_blocked": 1}, _report(0.0), admitting=True) == 0
    assert splits.budget(idle, _report(0.0), admitting=False) == 0


@pytest.fixture
def registry() -> Iterator[None]:
    yield
    fluidtoken_hook._splits.clear()
    fluidtoken_hook._forget.clear()
    fluidtoken_hook._forwarded.clear()


def test_hook_registry_turns_stolen_tokens_into_the_prefix_length(registry: None) -> None:
    post = fluidtoken_hook.handle_post
    assert post("/split", {"rid": "7", "suffix": 5}) == (200, {"ok": True})
    assert post("/split", {"rid": "8", "suffix": 50}) == (200, {"ok": True})
    prompt = list(range(12))
    split_of = fluidtoken_hook._split_of
    assert split_of(SimpleNamespace(rid="7", origin_input_ids=prompt)) == 7
    assert split_of(SimpleNamespace(rid="8", origin_input_ids=prompt)) == 0  # all of it
    assert split_of(SimpleNamespace(rid="9", origin_input_ids=prompt)) is None  # not stolen
    assert fluidtoken_hook.snapshot_fields()["fluid_pending"] == ["7", "8"]
    assert post("/split", {"rid": "7", "suffix": 0})[0] == 400
    assert post("/split", {"rid": "7"})[0] == 400
    assert post("/forget", {"room": 7}) == (200, {"ok": True}) and 7 in fluidtoken_hook._forget
    assert post("/nope", {})[0] == 404


def test_decode_budget_closes_when_the_halves_coming_in_will_fill_the_kv() -> None:
    splits = DecodeSplits(PROFILE, SLO_, CFG, "http://unused")
    capacity = PROFILE.kv.capacity_tokens
    snap = {"decode_batch": 0, "decode_context": 0, "t": time.time(), "fluid_pending": []}
    # Long generations handed over every few SGLang steps: at that rate the KV they hold
    # (Little's law) passes the worker's capacity, so no suffix may delay their streams.
    prompt, out = 8000, 2000
    for i in range(40):
        splits.take({"n_steps": 10 * i}, prompt, out)
    busy = {**snap, "n_steps": 400, "kv_capacity": capacity}
    assert splits.intake.forecast(400, capacity) >= 1.0
    assert splits.budget(busy, _report(0.0), admitting=True) == 0.0
    # The same halves spread over as many steps as they hold their KV: room to steal.
    calm = DecodeSplits(PROFILE, SLO_, CFG, "http://unused")
    for i in range(4):
        calm.take({"n_steps": 500 * i}, prompt, out)
    quiet = {**snap, "n_steps": 2000, "kv_capacity": capacity}
    assert calm.intake.forecast(2000, capacity) < 1.0
    assert calm.budget(quiet, _report(0.0), admitting=True) > 0.0
