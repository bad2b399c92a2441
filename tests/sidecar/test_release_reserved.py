"""A decode worker's D->P drain re-pairs the reservations whose prefill has not started
(``fluidpd.core.repair``): the prefill peer is asked, one it gives back ends here with
``reroute`` (the router pairs it again), one it has started or cannot answer for stays."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fluidpd.api.internal import Abort, RoleRequest
from fluidpd.core.types import Role, RoleState
from fluidpd_sidecar.peers import PeerError
from tests.sidecar.helpers import decode_half, events_of, sim_service, until


def test_decode_drain_repairs_only_what_the_prefill_peer_gives_back(tmp_path: Path) -> None:
    asked: list[tuple[str, int]] = []

    async def post(url: str, path: str, body: BaseModel) -> dict[str, Any]:
        if path != "/v1/internal/release":
            return {}  # the reservations' notices to the prefill peer
        assert isinstance(body, Abort)
        asked.append((url, body.rid))
        if body.rid == 2:
            raise PeerError("the prefill peer did not answer")
        return {"released": body.rid == 1}  # 3: its prefill has started

    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        svc.peers.post = post  # type: ignore[method-assign]
        await svc.start()
        try:
            for rid in (1, 2, 3):
                svc.accept_decode(decode_half(rid, 4))
            assert list(svc.worker.decode.reserved) == [1, 2, 3]
            status = svc.request_role(RoleRequest(role=Role.PREFILL))
            assert status.state is RoleState.DRAIN and status.target is Role.PREFILL
            await until(lambda: 1 not in svc.worker.decode.reserved, "1 was never released")
            events = await events_of(svc, 1)
            assert [e["event"] for e in events] == ["reroute"]
            await until(lambda: len(asked) == 3, "not every reservation was asked about")
            assert asked == [("http://p0.invalid", 1), ("http://p0.invalid", 2),
                             ("http://p0.invalid", 3)]  # fmt: skip
            # In flight as far as this worker knows: the drain waits for their KV.
            assert list(svc.worker.decode.reserved) == [2, 3]
            assert svc.worker.state is RoleState.DRAIN
        finally:
            await svc.stop()

    asyncio.run(go())
