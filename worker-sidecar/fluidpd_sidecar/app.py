"""The sidecar's HTTP surface (FastAPI)."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fluidpd import __version__
from fluidpd.api.internal import (
    Abort,
    Adopt,
    Budget,
    DecodeHalf,
    Handoff,
    PrefillHalf,
    PrefillOutcome,
    PressureReport,
    Released,
    Reserved,
    RetireRequest,
    RoleRequest,
    RoleStatus,
    SuffixCommit,
)
from fluidpd.core.types import RoleState
from fluidpd_sidecar.service import BadRequest, Conflict, NotFound, SidecarService

NDJSON = "application/x-ndjson"


def create_app(service: SidecarService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(
        title=f"FluidPD worker sidecar {service.cfg.worker_id}",
        version=__version__,
        lifespan=lifespan,
    )

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        token = service.cfg.admin_token
        if not token:
            return
        expected = f"Bearer {token}"
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(401, "missing or wrong bearer token")

    Admin = Depends(admin)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": exc.args[0] if exc.args else "not found"}, status_code=404)

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    # -- health and signals ---------------------------------------------------------------------
    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get(
        "/readyz", response_class=PlainTextResponse, responses={503: {"description": "not Active"}}
    )
    async def readyz() -> Response:
        state = service.worker.state
        if state is RoleState.ACTIVE:
            return PlainTextResponse("ready")
        return PlainTextResponse(f"not ready: {state.value}", status_code=503)

    @app.get("/pressure")
    async def pressure(
        n_prefill: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> PressureReport:
        return service.pressure(n_prefill)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- roles ----------------------------------------------------------------------------------
    @app.get("/role")
    async def get_role() -> RoleStatus:
        return service.role_status()

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
