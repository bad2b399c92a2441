"""The HTTP surface of an ``sglang`` worker's sidecar: the routes of ``fluidpd_sidecar.app``
that the router, controller, operator and dashboards use, served by ``SglangService``, plus
``GET /v1/internal/sglang`` (the prefill server's bootstrap address, for decode peers) and
``GET``/``PUT /admin/fluidtoken`` (``--force-steal`` read and changed at run time: a running
SGLang server takes minutes to restart)."""

# No ``from __future__ import annotations``: FastAPI must see the ``Annotated`` body
# dependencies, which are local to create_app, as objects.

from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fluidpd.api.internal import (
    Abort,
    DecodeHalf,
    FluidTokenSetting,
    PrefillHalf,
    PrefillOutcome,
    Released,
    SuffixCommit,
)
from fluidpd_sidecar.app import HALF, NDJSON, STREAM, bounds
from fluidpd_sidecar.http_base import INVALID, UNAUTHORIZED, detail, worker_app
from fluidpd_sidecar.sglang.service import SglangService


def create_app(service: SglangService) -> FastAPI:
    title = f"FluidPD sglang worker sidecar {service.cfg.worker_id}"
    app, Admin, body = worker_app(service, title, service.ready, bounds(service.cfg))
    prefill_body, prefill_doc = body(PrefillHalf)
    decode_body, decode_doc = body(DecodeHalf)
    abort_body, abort_doc = body(Abort)

    suffix_body, suffix_doc = body(SuffixCommit)
    fluidtoken_body, fluidtoken_doc = body(FluidTokenSetting)
    not_decode = detail(s409="not a decode worker")
    no_suffix = detail(s409="a steal asked of an SGLang server that runs the overlap scheduler")

    @app.post("/v1/internal/release", dependencies=[Admin], openapi_extra=abort_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def release(req: Annotated[Abort, abort_body]) -> Released:
        return Released(released=await service.release(req.rid))

    @app.get("/v1/internal/sglang", dependencies=[Admin], responses=UNAUTHORIZED)
    async def sglang_info() -> dict[str, Any]:
        return service.bootstrap_info()

    @app.post("/v1/internal/prefill", dependencies=[Admin], openapi_extra=prefill_doc,
              responses=HALF)  # fmt: skip
    async def prefill(half: Annotated[PrefillHalf, prefill_body]) -> PrefillOutcome:
        return await service.accept_prefill(half)

    @app.post("/v1/internal/decode", dependencies=[Admin], openapi_extra=decode_doc,
              response_class=StreamingResponse, responses={**STREAM, **HALF})  # fmt: skip
    async def decode(half: Annotated[DecodeHalf, decode_body]) -> StreamingResponse:
        return StreamingResponse(service.accept_decode(half), media_type=NDJSON)

    @app.post("/v1/internal/abort", dependencies=[Admin], openapi_extra=abort_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def abort(req: Annotated[Abort, abort_body]) -> dict[str, bool]:
        return {"found": await service.abort(req)}

    @app.get("/v1/internal/budget", dependencies=[Admin], responses=UNAUTHORIZED)
    async def budget() -> dict[str, Any]:
        return {"worker": service.cfg.worker_id, "budget": service.budget()}

    @app.post("/v1/internal/suffix", dependencies=[Admin], openapi_extra=suffix_doc,
              responses={**UNAUTHORIZED, **INVALID, **not_decode})  # fmt: skip
    async def suffix(req: Annotated[SuffixCommit, suffix_body]) -> dict[str, Any]:
        return {"budget": await service.suffix_committed(req)}

    @app.get("/admin/fluidtoken", dependencies=[Admin], responses=UNAUTHORIZED)
    async def get_fluidtoken() -> FluidTokenSetting:
        """This worker's FluidToken override (``force_steal``; null: none)."""
        return service.fluidtoken_setting()

    @app.put("/admin/fluidtoken", dependencies=[Admin], openapi_extra=fluidtoken_doc,
             responses={**UNAUTHORIZED, **INVALID, **no_suffix})  # fmt: skip
    async def put_fluidtoken(
        req: Annotated[FluidTokenSetting, fluidtoken_body],
    ) -> FluidTokenSetting:
        """Pins the stealing ratio beta in [0, 1] of the prompts this worker starts prefilling
        from now on (``--force-steal`` at run time, without restarting SGLang), or frees it
        (null); answers the setting now in force."""
        return service.set_fluidtoken(req)

    return app
