"""The router's HTTP surface: OpenAI-compatible completions and chat, models, admin, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
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
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from fluidpd import __version__
from fluidpd.api.sampling import SamplingParams
from fluidpd.core.pairing import LeastLoadedPairing, Pairing, RoundRobinPairing
from fluidpd.core.signals import allocatable_kv
from fluidpd.router.dispatch import Dispatcher, Job, RequestFailed
from fluidpd.router.openai_models import ChatCompletionRequest, CompletionRequest
from fluidpd.router.prompts import Prompter, PromptError
from fluidpd.router.responses import Api, Reply
from fluidpd.router.workers import WorkerSet

log = logging.getLogger("fluidpd.router")


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


_WORKER_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class WorkerList(BaseModel):
    """The whole worker set (it replaces the current one)."""

    model_config = ConfigDict(extra="forbid")

    workers: dict[Annotated[str, StringConstraints(pattern=_WORKER_ID)], AnyHttpUrl] = Field(
        min_length=1, max_length=4096, description="worker id -> sidecar URL (http or https)"
    )

    @field_validator("workers")
    @classmethod
    def _distinct_urls(cls, v: dict[str, AnyHttpUrl]) -> dict[str, AnyHttpUrl]:
        urls = [str(u).rstrip("/") for u in v.values()]
        if len(set(urls)) != len(urls):
            raise ValueError("two workers share one URL")
        return v

    def urls(self) -> dict[str, str]:
        return {w: str(u).rstrip("/") for w, u in self.workers.items()}


M = TypeVar("M", bound=BaseModel)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI request body for a handler that parses its body itself."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    for name, sub in defs.items():
        _SCHEMAS[name] = sub
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_SCHEMAS: dict[str, Any] = {}


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read already, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def _first_error(errors: Sequence[Any]) -> str:
    """Pydantic's first error as one line that starts with the field's name."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if first.get("type") == "extra_forbidden":
        msg = "unknown or unsupported field"
    else:
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


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


def _free_kv(pressure: dict[str, Any]) -> float:
    """A decode worker's allocatable KV from its last /pressure report (eq. 6, the core's)."""
    get = pressure.get
    return float(allocatable_kv(get("kv_capacity", 0), get("kv_used", 0), get("kv_reserved", 0)))


def create_app(cfg: RouterConfig, prompter: Prompter) -> FastAPI:
    """``prompter``: the served model's tokenizer and chat template (loaded by the caller, so
    a bad model directory fails at start with one line)."""
    metrics = _Metrics()
    pairing: Pairing
    workers: WorkerSet
    if cfg.pairing == "least-loaded":
        pairing = LeastLoadedPairing(
            prefill_backlog=lambda w: float(workers.workers[w].pressure.get("queue_len", 0)),
            decode_free_kv=lambda w: _free_kv(workers.workers[w].pressure),
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
        prompter.close()

    app = FastAPI(title="FluidPD router", version=__version__, lifespan=lifespan)

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        if cfg.admin_token and (
            authorization is None
            or not hmac.compare_digest(authorization, f"Bearer {cfg.admin_token}")
        ):
            raise HTTPException(401, "missing or wrong bearer token")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _first_error(exc.errors()))

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

    unauthorized: dict[int | str, dict[str, Any]] = {
        401: {"description": "missing or wrong bearer token"}
    }

    @app.get("/admin/stats", dependencies=[Depends(admin)], responses=unauthorized)
    async def stats() -> dict[str, Any]:
        return workers.stats()

    @app.post("/admin/poll", dependencies=[Depends(admin)], responses=unauthorized)
    async def poll_now() -> dict[str, Any]:
        """Re-read every worker now (the controller calls this when it starts or ends a switch)."""
        await workers.poll_once()
        return workers.stats()

    @app.put(
        "/admin/workers",
        dependencies=[Depends(admin)],
        responses={
            **unauthorized,
            400: {"description": "invalid worker list"},
            409: {"description": "the new set has no usable prefill/decode pair, the current does"},
        },
    )
    async def put_workers(body: WorkerList) -> dict[str, Any]:
        new = body.urls()
        # A set the router cannot serve with must not replace one it can (a bad call would
        # otherwise stop all serving until someone puts the list back).
        if workers.usable() and not await workers.usable_with(new):
            raise HTTPException(
                409,
                "workers: no reachable Active prefill and decode worker in the new set; "
                "the current set is kept",
            )
        workers.set(new)
        await workers.poll_once()
        log.info("worker set replaced: %s", ", ".join(sorted(new)))
        return workers.stats()

    def _budget(model: str, prompt_len: int, max_tokens: int | None, default: int) -> int:
        if model != cfg.model:
            raise HTTPException(404, f"model {model!r} is not served here (serving {cfg.model!r})")
        room = cfg.context_limit - prompt_len
        if room < 1:
            raise HTTPException(
                400,
                f"prompt: {prompt_len} tokens; the context limit is {cfg.context_limit}",
            )
        if max_tokens is None:
            return min(default, room)
        if max_tokens > room:
            raise HTTPException(
                400,
                f"max_tokens: {max_tokens} + prompt {prompt_len} tokens exceed the context "
                f"limit {cfg.context_limit}",
            )
        return max_tokens

    async def _serve(
        request: Request,
        api: Api,
        prompt_ids: list[int],
        sampling: SamplingParams,
        body: CompletionRequest | ChatCompletionRequest,
    ) -> Response:
        stream = body.stream
        usage = bool(body.stream_options and body.stream_options.include_usage)
        job = Job(prompt_ids, sampling.model_dump(), time.time())
        dispatcher: Dispatcher = state["dispatcher"]
        rid = f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        reply = Reply(
            api, rid, int(job.arrival), body.model, sampling.wants_logprobs, len(prompt_ids),
            body.return_tokens_as_token_ids,
        )  # fmt: skip
        metrics.inflight.inc()
        if stream:

            async def events() -> AsyncIterator[bytes]:
                first = True
                try:
                    async for event in dispatcher.generate(job):
                        if event["ids"] and job.tokens == len(event["ids"]):
                            metrics.ttft.observe(time.time() - job.arrival)
                        line = reply.chunk(event["text"], event.get("logprobs"), None, first)
                        if line is not None:
                            first = False
                            yield line
                    yield reply.chunk("", None, job.finish_reason or "length") or b""
                    if usage:
                        yield reply.usage_chunk(job.tokens)
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

        async def collect() -> None:
            async for event in dispatcher.generate(job):
                if event["ids"] and job.tokens == len(event["ids"]):
                    metrics.ttft.observe(time.time() - job.arrival)
                reply.add(event["text"], event.get("logprobs"))

        work = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                # Nobody waits for the answer: cancelling the work aborts both halves.
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestFailed):
                    await work
                metrics.requests.labels(api, "499").inc()
                return _error(499, "the client closed the connection")
            work.result()
        except RequestFailed as exc:
            metrics.requests.labels(api, str(exc.status)).inc()
            return _error(exc.status, exc.message, "server_error")
        finally:
            gone.cancel()
            work.cancel()
            metrics.inflight.dec()
            metrics.e2e.observe(time.time() - job.arrival)
        metrics.ok[api].inc()
        return JSONResponse(reply.body(job.finish_reason or "length", job.tokens))

    def _parse(model: type[M], raw: bytes) -> M:
        """Validates the body straight from bytes (pydantic's JSON parser), which takes a
        fraction of FastAPI's parse-then-validate on the hottest path."""
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            raise HTTPException(400, _first_error(exc.errors())) from None

    async def _tokenized(coro: Awaitable[list[int]]) -> list[int]:
        try:
            return await coro
        except PromptError as exc:
            raise HTTPException(400, str(exc)) from None

    def _sampling(body: CompletionRequest | ChatCompletionRequest, max_new: int, lp: bool,
                  top: int) -> SamplingParams:  # fmt: skip
        if body.stop_token_ids:
            try:
                prompter.check_ids(body.stop_token_ids, "stop_token_ids")
            except PromptError as exc:
                raise HTTPException(400, str(exc)) from None
        try:
            return body.sampling(max_new, lp, top)
        except ValidationError as exc:
            raise HTTPException(400, _first_error(exc.errors())) from None

    @app.post(
        "/v1/completions",
        openapi_extra={"requestBody": _body_schema(CompletionRequest)},
        responses={400: {"description": "invalid request"}, 404: {"description": "unknown model"}},
    )
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        prompt = body.prompt
        if isinstance(prompt, str):
            ids = await _tokenized(prompter.prompt_ids(prompt))
        elif len(prompt) > 1 and not all(isinstance(x, int) for x in prompt):
            raise HTTPException(400, "prompt: batched prompts are not supported; send one")
        elif isinstance(prompt[0], str):
            ids = await _tokenized(prompter.prompt_ids(prompt[0]))
        elif isinstance(prompt[0], list):
            ids = prompt[0]
        else:
            ids = prompt
        try:
            ids = prompter.check_ids(ids)
        except PromptError as exc:
            raise HTTPException(400, str(exc)) from None
        max_new = _budget(body.model, len(ids), body.max_tokens, cfg.default_max_tokens)
        lp = body.logprobs is not None
        sampling = _sampling(body, max_new, lp, body.logprobs or 0)
        return await _serve(request, "completions", ids, sampling, body)

    @app.post(
        "/v1/chat/completions",
        openapi_extra={"requestBody": _body_schema(ChatCompletionRequest)},
        responses={400: {"description": "invalid request"}, 404: {"description": "unknown model"}},
    )
    async def chat(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        if body.top_logprobs and not body.logprobs:
            raise HTTPException(400, "top_logprobs: needs logprobs = true")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        ids = await _tokenized(prompter.chat_prompt_ids(messages))
        max_tokens = body.max_completion_tokens or body.max_tokens
        max_new = _budget(body.model, len(ids), max_tokens, 256)
        sampling = _sampling(body, max_new, body.logprobs, body.top_logprobs or 0)
        return await _serve(request, "chat", ids, sampling, body)

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
