"""The router's HTTP surface: OpenAI-compatible completions and chat, models, admin, metrics."""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import aiohttp
import orjson
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, Field, ValidationError

from fluidpd import __version__
from fluidpd.core.pairing import LeastLoadedPairing, Pairing, RoundRobinPairing
from fluidpd.router import tokenizer
from fluidpd.router.dispatch import Dispatcher, Job, RequestFailed
from fluidpd.router.openai_models import ChatCompletionRequest, CompletionRequest
from fluidpd.router.workers import WorkerSet


@dataclass(frozen=True, slots=True)
class RouterConfig:
    model: str
    context_limit: int
    workers: dict[str, str]
    admin_token: str | None = None
    pairing: str = "round-robin"
    first_token_timeout_s: float = 60.0
    poll_s: float = 0.5
    #: Default max_tokens when a request gives none (OpenAI's completions default is 16).
    default_max_tokens: int = 16


class WorkerList(BaseModel):
    workers: dict[str, str] = Field(description="worker id -> sidecar URL")


M = TypeVar("M", bound=BaseModel)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI request body for a handler that parses its body itself."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    for name, sub in defs.items():
        _SCHEMAS[name] = sub
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_SCHEMAS: dict[str, Any] = {}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fluidpd_router_requests",
            "Requests by outcome",
            ["api", "status"],
            registry=self.registry,
        )
        # Label lookups cost microseconds on every request: bind the common ones once.
        self.ok = {api: self.requests.labels(api, "200") for api in ("chat", "completions")}
        self.inflight = Gauge(
            "fluidpd_router_inflight", "Requests in flight", registry=self.registry
        )
        self.ttft = Histogram(
            "fluidpd_router_ttft_seconds",
            "Time to first token at the router",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.e2e = Histogram(
            "fluidpd_router_e2e_seconds",
            "Request latency at the router",
            buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
            registry=self.registry,
        )
        self.retries = Gauge(
            "fluidpd_router_repairings",
            "Requests re-paired after a half was turned away",
            registry=self.registry,
        )


def create_app(cfg: RouterConfig) -> FastAPI:
    metrics = _Metrics()
    pairing: Pairing
    workers: WorkerSet
    if cfg.pairing == "least-loaded":
        pairing = LeastLoadedPairing(
            prefill_backlog=lambda w: float(workers.workers[w].pressure.get("queue_len", 0)),
            decode_free_kv=lambda w: float(
                workers.workers[w].pressure.get("kv_capacity", 0)
                - workers.workers[w].pressure.get("kv_used", 0)
                - workers.workers[w].pressure.get("kv_reserved", 0)
            ),
        )
    else:
        pairing = RoundRobinPairing()
    workers = WorkerSet(pairing, cfg.poll_s, cfg.admin_token)
    workers.set(cfg.workers)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=2.0)
        )
        state["dispatcher"] = Dispatcher(
            workers, session, cfg.admin_token, cfg.first_token_timeout_s
        )
        await workers.start(session)
        yield
        await workers.stop()
        await session.close()

    app = FastAPI(title="FluidPD router", version=__version__, lifespan=lifespan)

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        if cfg.admin_token and (
            authorization is None
            or not hmac.compare_digest(authorization, f"Bearer {cfg.admin_token}")
        ):
            raise HTTPException(401, "missing or wrong bearer token")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg')}" if where else str(first.get("msg")))

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "fluidpd"}],
        }

    @app.get("/metrics")
    async def prom() -> Response:
        metrics.retries.set(state["dispatcher"].retries)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/stats")
    async def stats() -> dict[str, Any]:
        return workers.stats()

    @app.post("/admin/poll", dependencies=[Depends(admin)])
    async def poll_now() -> dict[str, Any]:
        """Re-read every worker now (the controller calls this when it starts or ends a switch)."""
        await workers.poll_once()
        return workers.stats()

    @app.put("/admin/workers", dependencies=[Depends(admin)])
    async def put_workers(body: WorkerList) -> dict[str, Any]:
        workers.set(body.workers)
        await workers.poll_once()
        return workers.stats()

    def _budget(model: str, prompt_len: int, max_tokens: int | None, default: int) -> int:
        if model != cfg.model:
            raise HTTPException(404, f"model {model!r} is not served here (serving {cfg.model!r})")
        room = cfg.context_limit - prompt_len
        if room < 1:
            raise HTTPException(
                400, f"prompt is {prompt_len} tokens; the context limit is {cfg.context_limit}"
            )
        if max_tokens is None:
            return min(default, room)
        if max_tokens > room:
            raise HTTPException(
                400,
                f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceed the context "
                f"limit {cfg.context_limit}",
            )
        return max_tokens

    async def _serve(
        api: str, prompt_len: int, max_new: int, stream: bool, usage: bool, model: str
    ) -> Response:
        job = Job(prompt_len, max_new, time.time())
        dispatcher: Dispatcher = state["dispatcher"]
        rid = f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(job.arrival)
        obj = "chat.completion.chunk" if api == "chat" else "text_completion"

        def chunk(text: str, finish: str | None, first: bool = False) -> bytes:
            if api == "chat":
                delta: dict[str, Any] = {"content": text}
                if first:
                    delta["role"] = "assistant"
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            body = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            return b"data: " + orjson.dumps(body) + b"\n\n"

        def usage_of() -> dict[str, int]:
            return {
                "prompt_tokens": prompt_len,
                "completion_tokens": job.tokens,
                "total_tokens": prompt_len + job.tokens,
            }

        metrics.inflight.inc()
        if stream:

            async def events() -> AsyncIterator[bytes]:
                first = True
                try:
                    async for ids in dispatcher.generate(job):
                        if first:
                            metrics.ttft.observe(time.time() - job.arrival)
                        yield chunk(tokenizer.decode(ids), None, first)
                        first = False
                    yield chunk("", "length")
                    if usage:
                        body = {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": usage_of(),
                        }
                        yield b"data: " + orjson.dumps(body) + b"\n\n"
                    metrics.ok[api].inc()
                except RequestFailed as exc:
                    metrics.requests.labels(api, str(exc.status)).inc()
                    err = {
                        "error": {
                            "message": exc.message,
                            "type": "server_error",
                            "code": exc.status,
                        }
                    }
                    yield b"data: " + orjson.dumps(err) + b"\n\n"
                finally:
                    metrics.inflight.dec()
                    metrics.e2e.observe(time.time() - job.arrival)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            ids: list[int] = []
            async for part in dispatcher.generate(job):
                if not ids:
                    metrics.ttft.observe(time.time() - job.arrival)
                ids.extend(part)
        except RequestFailed as exc:
            metrics.requests.labels(api, str(exc.status)).inc()
            return _error(exc.status, exc.message, "server_error")
        finally:
            metrics.inflight.dec()
            metrics.e2e.observe(time.time() - job.arrival)
        metrics.ok[api].inc()
        text = tokenizer.decode(ids)
        if api == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            kind = "text_completion"
        return JSONResponse(
            {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage_of(),
            }
        )

    def _parse(model: type[M], raw: bytes) -> M:
        """Validates the body straight from bytes (pydantic's JSON parser), which takes a
        fraction of FastAPI's parse-then-validate on the hottest path."""
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise HTTPException(
                400, f"{where}: {first['msg']}" if where else first["msg"]
            ) from None

    @app.post(
        "/v1/completions",
        openapi_extra={"requestBody": _body_schema(CompletionRequest)},
        responses={400: {"description": "invalid request"}, 404: {"description": "unknown model"}},
    )
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        prompt = body.prompt
        if isinstance(prompt, str):
            prompt_len = len(tokenizer.encode(prompt))
        elif all(isinstance(x, int) for x in prompt):
            prompt_len = len(prompt)
        elif len(prompt) == 1:
            prompt_len = len(tokenizer.encode(str(prompt[0])))
        else:
            raise HTTPException(400, "prompt: batched prompts are not supported; send one")
        if prompt_len < 1:
            raise HTTPException(400, "prompt: empty after tokenization")
        max_new = _budget(body.model, prompt_len, body.max_tokens, cfg.default_max_tokens)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _serve("completions", prompt_len, max_new, body.stream, usage, body.model)

    @app.post(
        "/v1/chat/completions",
        openapi_extra={"requestBody": _body_schema(ChatCompletionRequest)},
        responses={400: {"description": "invalid request"}, 404: {"description": "unknown model"}},
    )
    async def chat(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        text = "\n".join(
            m.content
            if isinstance(m.content, str)
            else " ".join(str(part.get("text", "")) for part in (m.content or []))
            for m in body.messages
        )
        prompt_len = len(tokenizer.encode(text)) + 3 * len(body.messages)  # role markers
        max_new = _budget(
            body.model, prompt_len, body.max_completion_tokens or body.max_tokens, 256
        )
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _serve("chat", prompt_len, max_new, body.stream, usage, body.model)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        # The hand-parsed bodies' nested models go into the shared components.
        schema = base_openapi()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(_SCHEMAS)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
