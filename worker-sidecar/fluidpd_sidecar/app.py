"""The sidecar's HTTP surface (FastAPI)."""

# No ``from __future__ import annotations``: FastAPI must see the ``Annotated`` body
# dependencies, which are local to create_app, as objects.

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from fluidpd.api.http import token_bounds
from fluidpd.api.internal import (
    Abort,
    Activate,
    Adopt,
    Budget,
    DecodeHalf,
    Handoff,
    PrefillHalf,
    PrefillOutcome,
    Released,
    Reserved,
    SuffixCommit,
)
from fluidpd.core.types import RoleState
from fluidpd_sidecar.http_base import INVALID, UNAUTHORIZED, detail, worker_app
from fluidpd_sidecar.service import SidecarConfig, SidecarService

NDJSON = "application/x-ndjson"
STREAM: dict[int | str, dict[str, Any]] = {
    200: {"content": {NDJSON: {"schema": {"type": "string"}}}, "description": "NDJSON DecodeEvents"}
}
#: The statuses of a request half's routes (router -> worker).
HALF = {
    **UNAUTHORIZED,
    **INVALID,
    **detail(
        s400="the half cannot be served: prompt + max_new_tokens over the context limit, or "
        "token ids the engine refuses",
        s409="the worker is not Active in the half's role, or the request is here already",
    ),
}
#: ...and of the peer protocol's (worker -> worker) on a request the worker may not have.
PEER = {**UNAUTHORIZED, **INVALID, **detail(s404="no such request here")}


def bounds(cfg: SidecarConfig, output_vocab: int | None = None) -> Callable[[dict[str, Any]], None]:
    """This worker's vocabularies and context limit, stated in its request bodies' schemas:
    prompts are the served tokenizer's ids; a migrating request's outputs are ids its engine
    sampled (``Migration.output_vocab``; the tokenizer's when not given)."""
    ids = {"PrefillHalf": ("prompt_ids",), "DecodeHalf": ("prompt_ids",),
           "SamplingParams": ("stop_token_ids",)}  # fmt: skip
    lengths = {"SamplingParams": ("max_new_tokens",)}
    prompts = token_bounds(cfg.model.vocab_size, cfg.context_limit, ids, lengths)
    outputs = token_bounds(
        output_vocab or cfg.model.vocab_size, cfg.context_limit, {"Adopt": ("output_ids",)}, {}
    )

    def patch(models: dict[str, Any]) -> None:
        prompts(models)
        outputs(models)

    return patch


def create_app(service: SidecarService) -> FastAPI:
    def ready() -> tuple[bool, str]:
        state = service.worker.state
        return (True, "ready") if state is RoleState.ACTIVE else (False, state.value)

    app, Admin, body = worker_app(
        service,
        f"FluidPD worker sidecar {service.cfg.worker_id}",
        ready,
        bounds(service.cfg, service.output_vocab),
    )
    prefill_body, prefill_doc = body(PrefillHalf)
    decode_body, decode_doc = body(DecodeHalf)
    abort_body, abort_doc = body(Abort)
    reserved_body, reserved_doc = body(Reserved)
    suffix_body, suffix_doc = body(SuffixCommit)
    handoff_body, handoff_doc = body(Handoff)
    adopt_body, adopt_doc = body(Adopt)
    activate_body, activate_doc = body(Activate)

    # -- request halves (called by the router) --------------------------------------------------
    @app.post("/v1/internal/prefill", dependencies=[Admin], openapi_extra=prefill_doc,
              responses=HALF)  # fmt: skip
    async def prefill(half: Annotated[PrefillHalf, prefill_body]) -> PrefillOutcome:
        future = service.accept_prefill(half)
        try:
            return await future
        except BaseException:
            if not future.done():
                service.abort(Abort(rid=half.rid, reason="router went away"))
            raise

    @app.post("/v1/internal/decode", dependencies=[Admin], openapi_extra=decode_doc,
              response_class=StreamingResponse, responses={**STREAM, **HALF})  # fmt: skip
    async def decode(half: Annotated[DecodeHalf, decode_body]) -> StreamingResponse:
        sub = service.subscribe(service.accept_decode(half))
        return StreamingResponse(service.events(sub), media_type=NDJSON)

    @app.get(
        "/v1/internal/decode/{rid}/events",
        dependencies=[Admin],
        response_class=StreamingResponse,
        responses={
            **STREAM, **PEER, **detail(s409="the request is being streamed to another reader")
        },
    )  # fmt: skip
    async def decode_events(rid: int) -> StreamingResponse:
        half = service.subscribe(service.decode_half(rid))
        return StreamingResponse(service.events(half), media_type=NDJSON)

    @app.post("/v1/internal/abort", dependencies=[Admin], openapi_extra=abort_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def abort(req: Annotated[Abort, abort_body]) -> dict[str, bool]:
        return {"found": service.abort(req)}

    # -- peer protocol ----------------------------------------------------------------------------
    @app.post("/v1/internal/reserved", dependencies=[Admin], openapi_extra=reserved_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def reserved(req: Annotated[Reserved, reserved_body]) -> dict[str, bool]:
        service.reserved(req)
        return {"ok": True}

    @app.post("/v1/internal/suffix", dependencies=[Admin], openapi_extra=suffix_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def suffix(req: Annotated[SuffixCommit, suffix_body]) -> Budget:
        return Budget(worker=service.cfg.worker_id, budget=service.suffix_committed(req))

    @app.get("/v1/internal/budget", dependencies=[Admin], responses=UNAUTHORIZED)
    async def budget() -> Budget:
        return Budget(worker=service.cfg.worker_id, budget=service.budget())

    @app.post(
        "/v1/internal/handoff", dependencies=[Admin], openapi_extra=handoff_doc,
        responses={**PEER, **detail(
            s400="the KV cannot be taken: no room, it does not verify, or the whole prompt "
            "came without its first token"
        )},
    )  # fmt: skip
    async def handoff(req: Annotated[Handoff, handoff_body]) -> dict[str, bool]:
        service.handoff_done(req)
        return {"ok": True}

    @app.post("/v1/internal/release", dependencies=[Admin], openapi_extra=abort_doc,
              responses={**UNAUTHORIZED, **INVALID})  # fmt: skip
    async def release(req: Annotated[Abort, abort_body]) -> Released:
        return service.release(req.rid)

    @app.post(
        "/v1/internal/adopt", dependencies=[Admin], openapi_extra=adopt_doc,
        responses={**HALF, **detail(
            s409="the worker cannot take the request: not Active decode, no KV room, the "
            "engine cannot adopt, or the request is here already"
        )},
    )  # fmt: skip
    async def adopt(req: Annotated[Adopt, adopt_body]) -> dict[str, Any]:
        dest = service.adopt(req)
        if dest is None:
            return {"ok": True, "kv_pull": service.pulls(req.half.rid)}
        return {"ok": True, "kv_session": dest.session, "kv_addr": dest.addr,
                "kv_nbytes": dest.nbytes}  # fmt: skip

    @app.post(
        "/v1/internal/activate", dependencies=[Admin], openapi_extra=activate_doc,
        responses={**PEER, **detail(
            s400="the adopted request's KV does not import, or its source's slot cannot be read"
        )},
    )  # fmt: skip
    async def activate(req: Annotated[Activate, activate_body]) -> dict[str, bool]:
        await service.activate(req)
        return {"ok": True}

    return app
