"""A retirement can be called off, and one nobody completes ends by itself: a worker must
never stay out of service for good (issue #15: ``POST /retire`` left it draining forever)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fluidpd.api.internal import RetireRequest, RoleRequest
from fluidpd.core.types import DrainMode, Role, RoleState
from fluidpd_sidecar.service import BadRequest, Conflict
from tests.sidecar.helpers import decode_half, sim_service


def test_cancelled_retirement_takes_work_again(tmp_path: Path) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)
        await svc.start()
        try:
            status = svc.retire(RetireRequest(drain=DrainMode.MIGRATE))
            assert status.retiring and status.state is RoleState.DRAIN
            with pytest.raises(Conflict):
                svc.accept_decode(decode_half(1, 4))
            with pytest.raises(Conflict):
                svc.request_role(RoleRequest(role=Role.PREFILL))  # what wedged the controller
            status = svc.cancel_retire()
            assert not status.retiring and status.state is RoleState.ACTIVE
            assert status.role is Role.DECODE
            assert svc.cancel_retire() == status  # idempotent
            svc.accept_decode(decode_half(2, 4))  # takes work, and budgets, again
            assert svc.worker.decode.admitting and not svc.worker.decode.migrate_on_drain
            # ... and can switch again.
            assert svc.request_role(RoleRequest(role=Role.PREFILL)).state is RoleState.DRAIN
        finally:
            await svc.stop()

    asyncio.run(go())


@pytest.mark.parametrize(("after", "back"), [(30.0, True), (0.0, False)])
def test_abandoned_retirement_returns_to_service(tmp_path: Path, after: float, back: bool) -> None:
    async def go() -> None:
        svc = sim_service(tmp_path, "p1", Role.PREFILL)
        await svc.start()
        try:
            svc.retire(RetireRequest(return_after_s=after))
            t0 = svc.worker.role_sm.since
            svc.expire_retirement(t0 + 29.0)
            assert svc.worker.retiring
            svc.expire_retirement(t0 + 1e6)
            assert svc.worker.retiring is not back  # 0 means: wait to be deleted, forever
        finally:
            await svc.stop()

    asyncio.run(go())


def test_ids_the_engine_refuses_are_bad_input(tmp_path: Path) -> None:
    """An engine's own check (here: a vocabulary smaller than the tokenizer's) is a 400 with
    its reason, not a server error."""

    async def go() -> None:
        svc = sim_service(tmp_path, "d1", Role.DECODE)

        def refuse(*_: object) -> None:
            raise ValueError("token id 645 outside the vocabulary (0..511)")

        svc.engine.admit = refuse  # type: ignore[method-assign]
        with pytest.raises(BadRequest, match="vocabulary"):
            svc.accept_decode(decode_half(3, 4))
        assert 3 not in svc.decode_halves

    asyncio.run(go())
