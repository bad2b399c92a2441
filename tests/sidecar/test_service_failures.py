"""``SidecarService``'s failure paths in process (no HTTP, no subprocess), each staged on
purpose rather than reached by chance in a live run: a reservation that arrives before its
prefill half, reservations waiting for arena room, halves whose peer never comes through
(bootstrap expiry), and a prefill peer that dies before it hears of the reservation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fluidpd.api.internal import Abort, PrefillHalf, Reserved
from fluidpd.api.sampling import SamplingParams
from fluidpd.core.types import Role
from fluidpd_sidecar.peers import PeerError
from fluidpd_sidecar.transfer import KVDest
from tests.sidecar.helpers import decode_half, events_of, sim_service, until


def _prefill_half(rid: int) -> PrefillHalf:
    return PrefillHalf(
        rid=rid,
        prompt_ids=[7] * 32,
        sampling=SamplingParams(max_new_tokens=4),
        arrival=time.time(),
        decode_worker="d0",
        decode_url="http://d0.invalid",
    )


class _Posts:
    """Stands in for the peers: records every POST; ``fail`` paths raise ``PeerError``."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    async def __call__(self, url: str, path: str, body: BaseModel) -> dict[str, Any]:
        self.calls.append((path, int(getattr(body, "rid", -1))))
        if path in self.fail:
            raise PeerError(f"{url}{path}: ClientConnectorError: the peer is gone")
        return {}

    def rids(self, path: str) -> list[int]:
        return [rid for p, rid in self.calls if p == path]


class _OneSlotArena:
    """A transport whose receiving arena has room for one hand-off at a time."""

    name = "test"
    arena_bytes = 1 << 20

    def __init__(self) -> None:
        self.taken = False

    def reserve(self, nbytes: int) -> KVDest | None:
        if self.taken:
            return None
        self.taken = True
        return KVDest("arena", 4096, nbytes)

    def free(self, dest: KVDest) -> None:
        self.taken = False

    async def send(self, src_addr: int | None, dest: KVDest | None, nbytes: int) -> float:
        return 0.0


def test_a_reservation_before_its_prefill_half_is_kept_for_it(tmp_path: Path) -> None:
    """The decode side can be faster than the router's prefill call."""

    async def go() -> None:
        svc = sim_service(tmp_path, "p0", Role.PREFILL)
        svc.reserved(Reserved(rid=5, decode_worker="d0", t=time.time(), budget=3.0))
        assert svc.worker.prefill.queue_len == 0  # nothing to schedule yet
        svc.accept_prefill(_prefill_half(5))
        assert 5 not in svc.worker.prefill.bootstrap  # reserved: it may run now
        assert [r.rid for r in svc.worker.prefill.waiting] == [5]
        assert svc.budgets["d0"] == 3.0
        # Without one it waits for the decode side.
        svc.accept_prefill(_prefill_half(6))
        assert 6 in svc.worker.prefill.bootstrap

    asyncio.run(go())


def test_an_aborted_request_drops_its_early_reservation(tmp_path: Path) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "p0", Role.PREFILL)
        svc.reserved(Reserved(rid=8, decode_worker="d0", t=time.time()))
        assert not svc.abort(Abort(rid=8))  # no half here yet
        svc.accept_prefill(_prefill_half(8))
        assert 8 in svc.worker.prefill.bootstrap  # the reservation went with the abort

    asyncio.run(go())


def test_reservations_wait_in_order_for_arena_room(tmp_path: Path) -> None:
    posts = _Posts()

    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        arena = _OneSlotArena()
        svc.transfer = arena
        svc.peers.post = posts  # type: ignore[method-assign]
        await svc.start()
        try:
            for rid in (1, 2, 3):
                svc.accept_decode(decode_half(rid, 4))
            await until(lambda: posts.rids("/v1/internal/reserved") == [1], "1 not told")
            # 2 and 3 hold KV in the scheduler but no arena room: the prefill side is not told.
            assert list(svc.worker.decode.reserved) == [1, 2, 3]
            await asyncio.sleep(0.05)
            assert posts.rids("/v1/internal/reserved") == [1]
            svc.abort(Abort(rid=1))  # its room goes back: the next in line gets it
            await until(lambda: posts.rids("/v1/internal/reserved") == [1, 2], "2 not told")
            svc.abort(Abort(rid=3))  # leaves the queue without room ever
            svc.abort(Abort(rid=2))
            await asyncio.sleep(0.05)
            assert posts.rids("/v1/internal/reserved") == [1, 2]
            assert not arena.taken and not svc.worker.decode.reserved
        finally:
            await svc.stop()

    asyncio.run(go())


def test_halves_whose_peer_never_comes_through_expire(tmp_path: Path) -> None:
    posts = _Posts()

    async def go() -> None:
        d = sim_service(tmp_path, "d1", Role.DECODE, bootstrap_timeout_s=0.05)
        p = sim_service(tmp_path, "p1", Role.PREFILL, bootstrap_timeout_s=0.05)
        d.peers.post = posts  # type: ignore[method-assign]
        await d.start()
        await p.start()
        try:
            d.accept_decode(decode_half(4, 4))  # reserved, but no hand-off ever comes
            outcome = p.accept_prefill(_prefill_half(9))  # no reservation ever comes
            events = await asyncio.wait_for(events_of(d, 4), 30)
            done = await asyncio.wait_for(outcome, 30)
        finally:
            await d.stop()
            await p.stop()
        assert [e["event"] for e in events] == ["error"]
        assert "no KV hand-off from the prefill peer" in str(events[0]["detail"])
        assert d.worker.decode.committed == 0
        assert done.status == "cancelled" and "no KV reservation" in done.detail
        assert 9 not in p.worker.prefill.bootstrap

    asyncio.run(go())


def test_a_prefill_peer_gone_before_the_reservation_reached_it(tmp_path: Path) -> None:
    """Told twice (a pooled connection the peer just closed fails once now and then), then
    the reservation goes back and the decode half fails: its KV would never come."""
    posts = _Posts(fail=("/v1/internal/reserved",))

    async def go() -> list[dict[str, Any]]:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        svc.peers.post = posts  # type: ignore[method-assign]
        await svc.start()
        try:
            svc.accept_decode(decode_half(3, 4))
            events = await asyncio.wait_for(events_of(svc, 3), 30)
            assert svc.worker.decode.committed == 0 and not svc.worker.decode.reserved
            # The worker takes work again: its KV was not lost with the request.
            svc.accept_decode(decode_half(4, 4))
            assert 4 in svc.worker.decode.reserved
            return events
        finally:
            await svc.stop()

    events = asyncio.run(go())
    assert posts.rids("/v1/internal/reserved")[:2] == [3, 3]
    assert [(e["event"], e["detail"]) for e in events] == [("error", "prefill peer unreachable")]


def test_a_decode_peer_dying_mid_hand_off_cancels_the_prefill_half(tmp_path: Path) -> None:
    """The KV is sent, then the decode peer is gone before it hears of it: the prefill half
    ends "cancelled" naming the hand-off (the router re-pairs on that), and the prefill
    worker is left with nothing of the request, taking the next one."""
    posts = _Posts(fail=("/v1/internal/handoff",))

    async def go() -> tuple[Any, Any]:
        svc = sim_service(tmp_path, "p1", Role.PREFILL)
        svc.peers.post = posts  # type: ignore[method-assign]
        await svc.start()
        try:
            svc.reserved(Reserved(rid=6, decode_worker="d0", t=time.time(), budget=0.0))
            lost = await asyncio.wait_for(svc.accept_prefill(_prefill_half(6)), 30)
            assert 6 not in svc.prefill_halves and svc.worker.prefill.queue_len == 0
            posts.fail = ()  # the next decode peer is there
            svc.reserved(Reserved(rid=7, decode_worker="d0", t=time.time(), budget=0.0))
            kept = await asyncio.wait_for(svc.accept_prefill(_prefill_half(7)), 30)
            return lost, kept
        finally:
            await svc.stop()

    lost, kept = asyncio.run(go())
    assert posts.rids("/v1/internal/handoff") == [6, 7]
    assert lost.status == "cancelled" and "hand-off failed" in lost.detail
    assert "the peer is gone" in lost.detail
    assert kept.status == "done"
