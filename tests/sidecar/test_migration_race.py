"""The lost migrated request (issue #15): the adopting worker can finish a migrated request
before the router has re-attached to its event stream. The events of a request nobody has
claimed yet must wait for the router, not vanish with the request (the router then got
``migrated request lost (HTTP 404)``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from fluidpd.api.internal import Abort, Activate, Adopt
from fluidpd.core.types import Role
from fluidpd_sidecar.service import NotFound, SidecarService
from tests.sidecar.helpers import decode_half, events_of, sim_service


async def _finished(svc: SidecarService, rid: int) -> None:
    d = svc.worker.decode
    for _ in range(500):
        joining = any(r.rid == rid for r, _ in d.joining)
        if rid not in d.active and rid not in d.migrating_in and not joining:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"request {rid} never finished")


def _adopt(svc: SidecarService, rid: int, generated: int, max_new: int) -> list[int]:
    """Adopts a request that generated ``generated`` tokens elsewhere; returns their ids."""
    sim = svc.engine
    sim.admit(rid, [7] * 32, decode_half(rid, max_new).sampling)
    ids = [t.id for t in sim.outputs(rid, 0, generated)]
    sim.release(rid)
    svc.adopt(
        Adopt(half=decode_half(rid, max_new), generated=generated, output_ids=ids,
              first_token_t=1.0)
    )  # fmt: skip
    return ids


def test_migrated_request_finished_before_the_router_reattached(tmp_path: Path) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        await svc.start()
        try:
            before = _adopt(svc, 41, generated=5, max_new=8)
            await svc.activate(Activate(rid=41))
            await _finished(svc, 41)  # the target is faster than the router's GET
            events = await events_of(svc, 41)
        finally:
            await svc.stop()
        tokens = [e for e in events if e["event"] == "token"]
        assert events[-1]["event"] == "done" and events[-1]["n"] == 8
        # The stream continues where the source left it: the 3 remaining tokens, in order.
        ids = [i for e in tokens for i in e["ids"]]
        svc_engine_ids = _expected_ids(tmp_path, 41, 8)
        assert before + ids == svc_engine_ids
        assert [e["n"] for e in tokens][-1] == 8

    asyncio.run(go())


def _expected_ids(tmp_path: Path, rid: int, n: int) -> list[int]:
    """The same request's output never migrated (the sim engine is deterministic)."""
    svc = sim_service(tmp_path, "ref", Role.DECODE)
    svc.engine.admit(rid, [7] * 32, decode_half(rid, n).sampling)
    return [t.id for t in svc.engine.outputs(rid, 0, n)]


def test_unclaimed_migrated_request_is_claimed_once(tmp_path: Path) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        await svc.start()
        try:
            _adopt(svc, 42, generated=2, max_new=4)
            await svc.activate(Activate(rid=42))
            await _finished(svc, 42)
            await events_of(svc, 42)
            # Once read to its end, the request is gone: a second reader gets 404, not a hang.
            with pytest.raises(NotFound):
                svc.decode_half(42)
        finally:
            await svc.stop()

    asyncio.run(go())


def test_unclaimed_migrated_request_expires(tmp_path: Path) -> None:
    """A router that never re-attaches (it crashed) does not leave the events behind."""

    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE, unclaimed_timeout_s=0.0)
        await svc.start()
        try:
            _adopt(svc, 43, generated=2, max_new=4)
            await svc.activate(Activate(rid=43))
            await _finished(svc, 43)
            svc.expire_unclaimed(float("inf"))
            with pytest.raises(NotFound):
                svc.decode_half(43)
        finally:
            await svc.stop()

    asyncio.run(go())


def test_abort_of_an_unclaimed_migrated_request(tmp_path: Path) -> None:
    """The client went away while the request moved: the abort finds it on the target."""

    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        await svc.start()
        try:
            _adopt(svc, 44, generated=2, max_new=4000)
            await svc.activate(Activate(rid=44))
            assert svc.abort(Abort(rid=44, reason="client went away"))
            events = await events_of(svc, 44)
            assert events[-1]["event"] == "cancelled"
            assert 44 not in svc.worker.decode.active
        finally:
            await svc.stop()

    asyncio.run(go())


def test_life_cycle_is_logged_by_request_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        await svc.start()
        try:
            _adopt(svc, 45, generated=2, max_new=4)
            await svc.activate(Activate(rid=45))
            await _finished(svc, 45)
        finally:
            await svc.stop()

    with caplog.at_level(logging.INFO, logger="fluidpd.sidecar"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records]
    assert "request 45 adopted (migrating in after 2 tokens)" in lines
    assert "request 45 finished (length, 4 tokens)" in lines
