"""A refused adoption books room on the adopting worker (``fluidpd.core.migration``): its KV
admission leaves the room free for the stream, a new request waits behind it, and the
booking lapses when its source stops asking - the scheduler wakes for that by itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fluidpd.api.internal import Adopt
from fluidpd.core.migration import BOOKING_TTL_S
from fluidpd.core.types import Role
from fluidpd_sidecar.errors import Conflict
from fluidpd_sidecar.service import SidecarService
from tests.sidecar.helpers import decode_half, sim_service, until


def _adopt_body(svc: SidecarService, rid: int, generated: int, max_new: int) -> Adopt:
    sim = svc.engine
    half = decode_half(rid, max_new, prompt_len=400)
    sim.admit(rid, half.prompt_ids, half.sampling)
    ids = [t.id for t in sim.outputs(rid, 0, generated)]
    sim.release(rid)
    return Adopt(half=half, generated=generated, output_ids=ids, first_token_t=1.0)


@contextlib.asynccontextmanager
async def _booking_decoder(tmp_path: Path, notices: list[int]) -> AsyncIterator[SidecarService]:
    """A started decode sidecar with 1,000 tokens of KV, 600 held by request 1 (reserved; its
    prefill peer is a stub that notes each reservation notice in ``notices``), and request 2's
    adoption (500 tokens) refused once: booked."""

    async def post(url: str, path: str, body: BaseModel) -> dict[str, Any]:
        notices.append(int(getattr(body, "rid", -1)))
        return {}

    svc = sim_service(tmp_path, "d1", Role.DECODE)
    svc.peers.post = post  # type: ignore[method-assign]
    svc.worker.decode.kv_capacity = 1000
    await svc.start()
    try:
        svc.accept_decode(decode_half(1, 100, prompt_len=500))
        assert list(svc.worker.decode.reserved) == [1]
        with pytest.raises(Conflict, match="booked"):
            svc.adopt(_adopt_body(svc, 2, generated=3, max_new=100))
        yield svc
    finally:
        await svc.stop()


def test_a_refused_adoption_books_room_until_its_source_stops_asking(tmp_path: Path) -> None:
    notices: list[int] = []

    async def go() -> None:
        async with _booking_decoder(tmp_path, notices) as svc:
            d = svc.worker.decode
            body = _adopt_body(svc, 2, generated=3, max_new=100)
            for _ in range(3):  # each round of its source's drain asks again
                with pytest.raises(Conflict, match="booked"):
                    svc.adopt(body)
            assert set(d.bookings) == {2} and 2 not in d.migrating_in
            # 3 fits the 400 tokens left, but not beside the booked 500: it waits for KV (no
            # await since the last ask: the booking cannot lapse meanwhile).
            svc.accept_decode(decode_half(3, 100, prompt_len=200))
            assert [r.rid for r in d.prealloc] == [3]
            lapses = d.next_booking_expiry()
            assert lapses is not None and lapses - time.time() <= BOOKING_TTL_S
            # Nobody asks again: the booking lapses, and the scheduler, with nothing else to
            # wake it, admits 3.
            await until(lambda: 3 in d.reserved, "3 was never admitted after the booking lapsed")
            assert not d.bookings and time.time() >= lapses
            await until(lambda: 3 in notices, "the prefill peer never heard of 3's KV")

    asyncio.run(go())


def test_a_booked_stream_adopts_once_room_frees(tmp_path: Path) -> None:
    async def go() -> None:
        async with _booking_decoder(tmp_path, []) as svc:
            d = svc.worker.decode
            body = _adopt_body(svc, 2, generated=3, max_new=100)
            with pytest.raises(Conflict, match="booked"):
                svc.adopt(body)
            svc.accept_decode(decode_half(3, 100, prompt_len=500))  # 600: waits for 1 either way
            assert d.cancel(1) is not None
            # 1 is gone: 3 would fit its 600 tokens, but the booked stream comes first.
            assert [r.rid for r in d.prealloc] == [3]
            svc.adopt(body)
            assert 2 in d.migrating_in and not d.bookings
            assert [r.rid for r in d.prealloc] == [3]

    asyncio.run(go())
