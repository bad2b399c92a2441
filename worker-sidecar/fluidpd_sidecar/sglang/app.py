"""The HTTP surface of an ``sglang`` worker's sidecar: the routes of ``fluidpd_sidecar.app``
that the router, controller, operator and dashboards use, served by ``SglangService``, plus
``GET /v1/internal/sglang`` (the prefill server's bootstrap address, for decode peers)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fluidpd.api.internal import (
    Abort,
    DecodeHalf,
    PrefillHalf,
    PrefillOutcome,
    Released,
    RetireRequest,
    RoleRequest,
    RoleStatus,
    SuffixCommit,
)
from fluidpd_sidecar.http_base import worker_app
from fluidpd_sidecar.sglang.service import SglangService

NDJSON = "application/x-ndjson"


def create_app(service: SglangService) -> FastAPI:
    title = f"FluidPD sglang worker sidecar {service.cfg.worker_id}"
    app, Admin = worker_app(service, title, service.ready)

    @app.post("/role", dependencies=[Admin], responses={409: {"description": "not now"}})
    async def post_role(body: RoleRequest) -> RoleStatus:
        return service.request_role(body)

    @app.post("/retire", dependencies=[Admin])
    async def post_retire(body: RetireRequest) -> RoleStatus:
        return service.retire(body)

    @app.delete("/retire", dependencies=[Admin])
    async def delete_retire() -> RoleStatus:
        """Calls off a retirement: the worker returns to service in its role (idempotent)."""
        return service.cancel_retire()

    @app.post("/v1/internal/release", dependencies=[Admin])
    async def release(body: Abort) -> Released:
        return Released(released=await service.release(body.rid))

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
        return {"worker": service.cfg.worker_id, "budget": service.budget()}

    @app.post("/v1/internal/suffix", dependencies=[Admin])
    async def suffix(body: SuffixCommit) -> dict[str, Any]:
        return {"budget": await service.suffix_committed(body)}

    return app
