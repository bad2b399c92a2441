"""The sidecar's HTTP surface (FastAPI)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fluidpd.api.internal import (
    Abort,
    Adopt,
    Budget,
    DecodeHalf,
    Handoff,
    PrefillHalf,
    PrefillOutcome,
    Released,
    Reserved,
    RetireRequest,
    RoleRequest,
    RoleStatus,
    SuffixCommit,
)
from fluidpd.core.types import RoleState
from fluidpd_sidecar.http_base import worker_app
from fluidpd_sidecar.service import SidecarService

NDJSON = "application/x-ndjson"


def create_app(service: SidecarService) -> FastAPI:
    def ready() -> tuple[bool, str]:
        state = service.worker.state
        return (True, "ready") if state is RoleState.ACTIVE else (False, state.value)

    app, Admin = worker_app(service, f"FluidPD worker sidecar {service.cfg.worker_id}", ready)

    # -- roles ----------------------------------------------------------------------------------
    @app.post("/role", dependencies=[Admin], responses={409: {"description": "switch under way"}})
    async def post_role(body: RoleRequest) -> RoleStatus:
        return service.request_role(body)

    @app.post("/retire", dependencies=[Admin], responses={409: {"description": "switch under way"}})
    async def post_retire(body: RetireRequest) -> RoleStatus:
        return service.retire(body)

    @app.delete("/retire", dependencies=[Admin])
    async def delete_retire() -> RoleStatus:
        """Calls off a retirement: the worker returns to service in its role (idempotent)."""
        return service.cancel_retire()

    # -- request halves (called by the router) --------------------------------------------------
    @app.post("/v1/internal/prefill", dependencies=[Admin])
    async def prefill(body: PrefillHalf) -> PrefillOutcome:
        future = service.accept_prefill(body)
        try:
            return await future
        except BaseException:
            if not future.done():
                service.abort(Abort(rid=body.rid, reason="router went away"))
            raise

    @app.post(
        "/v1/internal/decode",
        dependencies=[Admin],
        response_class=StreamingResponse,
        responses={200: {"content": {NDJSON: {}}, "description": "NDJSON DecodeEvent stream"}},
    )
    async def decode(body: DecodeHalf) -> StreamingResponse:
        half = service.subscribe(service.accept_decode(body))
        return StreamingResponse(service.events(half), media_type=NDJSON)

    @app.get(
        "/v1/internal/decode/{rid}/events",
        dependencies=[Admin],
        response_class=StreamingResponse,
        responses={200: {"content": {NDJSON: {}}, "description": "NDJSON DecodeEvent stream"}},
    )
    async def decode_events(rid: int) -> StreamingResponse:
        half = service.subscribe(service.decode_half(rid))
        return StreamingResponse(service.events(half), media_type=NDJSON)

    @app.post("/v1/internal/abort", dependencies=[Admin])
    async def abort(body: Abort) -> dict[str, bool]:
        return {"found": service.abort(body)}

    # -- peer protocol ----------------------------------------------------------------------------
    @app.post("/v1/internal/reserved", dependencies=[Admin])
    async def reserved(body: Reserved) -> dict[str, bool]:
        service.reserved(body)
        return {"ok": True}

    @app.post("/v1/internal/suffix", dependencies=[Admin])
    async def suffix(body: SuffixCommit) -> Budget:
        return Budget(worker=service.cfg.worker_id, budget=service.suffix_committed(body))

    @app.get("/v1/internal/budget", dependencies=[Admin])
    async def budget() -> Budget:
        return Budget(worker=service.cfg.worker_id, budget=service.budget())

    @app.post("/v1/internal/handoff", dependencies=[Admin])
    async def handoff(body: Handoff) -> dict[str, bool]:
        service.handoff_done(body)
        return {"ok": True}

    @app.post("/v1/internal/release", dependencies=[Admin])
    async def release(body: Abort) -> Released:
        return service.release(body.rid)

    @app.post("/v1/internal/adopt", dependencies=[Admin])
    async def adopt(body: Adopt) -> dict[str, Any]:
        dest = service.adopt(body)
        if dest is None:
            return {"ok": True}
        return {"ok": True, "kv_session": dest.session, "kv_addr": dest.addr,
                "kv_nbytes": dest.nbytes}  # fmt: skip

    @app.post("/v1/internal/activate", dependencies=[Admin])
    async def activate(body: Abort) -> dict[str, bool]:
        service.activate(body.rid)
        return {"ok": True}

    return app
