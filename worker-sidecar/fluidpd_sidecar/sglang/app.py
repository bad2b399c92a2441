"""The HTTP surface of an ``sglang`` worker's sidecar: the routes of ``fluidpd_sidecar.app``
that the router, controller, operator and dashboards use, served by ``SglangService``, plus
``GET /v1/internal/sglang`` (the prefill server's bootstrap address, for decode peers)."""

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
    DecodeHalf,
    PrefillHalf,
    PrefillOutcome,
    PressureReport,
    RetireRequest,
    RoleRequest,
    RoleStatus,
)
from fluidpd_sidecar.service import BadRequest, Conflict
from fluidpd_sidecar.sglang.service import SglangService

NDJSON = "application/x-ndjson"


def create_app(service: SglangService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(
        title=f"FluidPD sglang worker sidecar {service.cfg.worker_id}",
        version=__version__,
        lifespan=lifespan,
    )

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        token = service.cfg.admin_token
        if not token:
            return
        if authorization is None or not hmac.compare_digest(authorization, f"Bearer {token}"):
            raise HTTPException(401, "missing or wrong bearer token")

    Admin = Depends(admin)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get(
        "/readyz", response_class=PlainTextResponse, responses={503: {"description": "not ready"}}
    )
    async def readyz() -> Response:
        ok, why = service.ready()
        return PlainTextResponse(why if ok else f"not ready: {why}", status_code=200 if ok else 503)

    @app.get("/pressure")
    async def pressure(
        n_prefill: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> PressureReport:
        return service.pressure(n_prefill)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/role")
    async def get_role() -> RoleStatus:
        return service.role_status()

    @app.post("/role", dependencies=[Admin], responses={409: {"description": "not supported"}})
    async def post_role(body: RoleRequest) -> RoleStatus:
        return service.request_role(body.role)

    @app.post("/retire", dependencies=[Admin])
    async def post_retire(body: RetireRequest) -> RoleStatus:
        return service.retire()

    @app.get("/v1/internal/sglang", dependencies=[Admin])
    async def sglang_info() -> dict[str, Any]:
        return service.bootstrap_info()

    @app.post("/v1/internal/prefill", dependencies=[Admin])
    async def prefill(body: PrefillHalf) -> PrefillOutcome:
        return await service.accept_prefill(body)

    @app.post(
        "/v1/internal/decode",
        dependencies=[Admin],
        response_class=StreamingResponse,
        responses={200: {"content": {NDJSON: {}}, "description": "NDJSON DecodeEvent stream"}},
    )
    async def decode(body: DecodeHalf) -> StreamingResponse:
        return StreamingResponse(service.accept_decode(body), media_type=NDJSON)

    @app.post("/v1/internal/abort", dependencies=[Admin])
    async def abort(body: Abort) -> dict[str, bool]:
        return {"found": await service.abort(body)}

    @app.get("/v1/internal/budget", dependencies=[Admin])
    async def budget() -> dict[str, Any]:
        return {"worker": service.cfg.worker_id, "budget": 0.0}

    return app
