"""FluidToken's split on the sglang engine without SGLang: the prefill planner (the core's
``PrefillSide``) deciding what SGLang's prefill server gets and telling the decode peer first,
the decode side's budget and pending suffix bookkeeping, and the hook's split registry.

The decode peer and the prefill hook are a small real HTTP server here (what they answer is
all the planner sees of them); the real ones run in test_sglang_fluidtoken.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
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
    app = web.Application()
    app.router.add_post("/v1/internal/suffix", peer.suffix)
    app.router.add_post("/forget", peer.forget)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


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
        expected.insert(0, ("suffix", {"rid": 7, "tokens": stolen}))
    assert log == expected
    assert out == PrefillOutcome(status="done", stolen=stolen)
    assert planner.stolen_tokens == stolen
    assert planner.budgets == ({"d0": 123.0} if stolen else {})
    assert not planner.side.waiting and planner.side.running is None


def test_beta_one_asks_no_prefill_server_and_forgets_the_room() -> None:
    out, log, _ = asyncio.run(_run_planner(1.0, 10))
    assert log == [("suffix", {"rid": 7, "tokens": 10}), ("forget", {"room": 7})]
    assert out == PrefillOutcome(status="done", stolen=10)


def test_a_split_the_decode_peer_did_not_take_is_prefilled_whole() -> None:
    # Safe either way: a decode side that did register it recomputes KV it already has.
    out, log, planner = asyncio.run(_run_planner(0.5, 10, refuse=True))
    assert log == [("suffix", {"rid": 7, "tokens": 5}), ("sglang", list(range(100, 110)))]
    assert out == PrefillOutcome(status="done", stolen=0)
    assert planner.stolen_tokens == 0


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
    assert d.steal_budget(2) == advertised_budget(
        *args, d.pending_suffix_tokens, d.dpi_load(), 2, CFG
    )
    assert advertised_budget(*args, 0, d.dpi_load(), 2, CFG) >= d.steal_budget(2)
    assert advertised_budget(*args, 0, d.dpi_load(), 2, CFG, admitting=False) == 0.0
    # Loaded past DPI_load^high: the gate of eq. (12) closes.
    assert advertised_budget(*args, 0, CFG.dpi_load_high, 2, CFG) == 0.0


def _report(dpi: float) -> PressureReport:
    return PressureReport(
        worker="d0", role=Role.DECODE, state="active", queue_ppi=0.0, attributable_ppi=0.0,
        queue_len=0, dpi_load=dpi, dpi_adm=1.0, batch=0, kv_used=0, kv_reserved=0,
        kv_capacity=1000, steal_budget=0.0, drain_cost=0.0,
    )  # fmt: skip


def test_decode_budget_counts_registered_suffixes_until_the_hook_ran_them() -> None:
    splits = DecodeSplits(PROFILE, SLO_, CFG, "http://unused")
    t0 = time.time()
    splits.pending[5] = (400, t0)
    idle = {"decode_batch": 0, "decode_context": 0, "t": t0 + 1, "fluid_pending": ["5"]}
    full = advertised_budget(SLO_.tpot, splits.decode, splits.suffix, 0, 0, 0, 0.0, 1, CFG)
    assert splits.pending_tokens(idle) == 400
    assert splits.budget(idle, _report(0.0), admitting=True) == max(0.0, full - 400)
    # A snapshot from before the registration does not clear it; a later one without it does.
    assert splits.pending_tokens({**idle, "fluid_pending": [], "t": t0 - 1}) == 400
    assert splits.pending_tokens({**idle, "fluid_pending": []}) == 0 and not splits.pending
    assert splits.budget(idle, _report(0.0), admitting=True) == full > 0
    # Requests waiting for KV room here, or a worker draining: nothing to steal onto it.
    assert splits.budget({**idle, "prealloc_blocked": 1}, _report(0.0), admitting=True) == 0
    assert splits.budget(idle, _report(0.0), admitting=False) == 0


@pytest.fixture
def registry() -> Iterator[None]:
    yield
    fluidtoken_hook._splits.clear()
    fluidtoken_hook._forget.clear()


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
