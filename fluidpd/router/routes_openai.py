"""The OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions`` (streaming or
not) and ``/v1/models``."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from fluidpd.api.http import BodyError, Components, first_error, parse_json
from fluidpd.api.sampling import SamplingParams
from fluidpd.router.context import RouterContext
from fluidpd.router.dispatch import Job, RequestFailed
from fluidpd.router.errors import error
from fluidpd.router.openai_models import ChatCompletionRequest, CompletionRequest
from fluidpd.router.openapi import SERVING
from fluidpd.router.prompts import PromptError
from fluidpd.router.responses import Api, Reply

M = TypeVar("M", bound=BaseModel)


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read already, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _parse(model: type[M], raw: bytes) -> M:
    """Validates the body straight from bytes (pydantic's strict JSON mode: exactly what the
    schema allows), which also takes a fraction of FastAPI's parse-then-validate on the
    hottest path."""
    try:
        return parse_json(model, raw)
    except BodyError as exc:
        raise HTTPException(400, str(exc)) from None


async def _tokenized(coro: Awaitable[list[int]]) -> list[int]:
    try:
        return await coro
    except PromptError as exc:
        raise HTTPException(400, str(exc)) from None


class _Server:
    """One request from its parsed body to its response (the routes' shared path)."""

    def __init__(self, ctx: RouterContext) -> None:
        self.ctx = ctx

    def budget(self, model: str, prompt_len: int, max_tokens: int | None, default: int) -> int:
        cfg = self.ctx.cfg
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

    def sampling(self, body: CompletionRequest | ChatCompletionRequest, max_new: int, lp: bool,
                 top: int) -> SamplingParams:  # fmt: skip
        if body.stop_token_ids:
            try:
                self.ctx.prompter.check_ids(body.stop_token_ids, "stop_token_ids")
            except PromptError as exc:
                raise HTTPException(400, str(exc)) from None
        try:
            return body.sampling(max_new, lp, top)
        except ValidationError as exc:
            raise HTTPException(400, first_error(exc.errors())) from None

    async def serve(
        self,
        request: Request,
        api: Api,
        prompt_ids: list[int],
        sampling: SamplingParams,
        body: CompletionRequest | ChatCompletionRequest,
    ) -> Response:
        rid = f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        job = Job(prompt_ids, sampling.model_dump(), time.time(), public_id=rid)
        # Counted once per client request (a re-pairing is not a new arrival), as the simulator.
        self.ctx.arrivals.add(job.arrival, len(prompt_ids), sampling.max_new_tokens)
        reply = Reply(
            api, rid, int(job.arrival), body.model, sampling.wants_logprobs, len(prompt_ids),
            body.return_tokens_as_token_ids,
        )  # fmt: skip
        self.ctx.metrics.inflight.inc()
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self._events(api, job, reply, usage), media_type="text/event-stream"
            )
        return await self._whole(request, api, job, reply)

    async def _events(self, api: Api, job: Job, reply: Reply, usage: bool) -> AsyncIterator[bytes]:
        metrics = self.ctx.metrics
        first = True
        try:
            async for event in self.ctx.dispatcher.generate(job):
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
            err = {"error": {"message": exc.message, "type": "server_error", "code": exc.status}}
            yield b"data: " + orjson.dumps(err) + b"\n\n"
        finally:
            metrics.inflight.dec()
            metrics.e2e.observe(time.time() - job.arrival)
        yield b"data: [DONE]\n\n"

    async def _whole(self, request: Request, api: Api, job: Job, reply: Reply) -> Response:
        metrics = self.ctx.metrics

        async def collect() -> None:
            async for event in self.ctx.dispatcher.generate(job):
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
                return error(499, "the client closed the connection")
            work.result()
        except RequestFailed as exc:
            metrics.requests.labels(api, str(exc.status)).inc()
            return error(exc.status, exc.message, "server_error")
        finally:
            gone.cancel()
            work.cancel()
            metrics.inflight.dec()
            metrics.e2e.observe(time.time() - job.arrival)
        metrics.ok[api].inc()
        return JSONResponse(reply.body(job.finish_reason or "length", job.tokens))


def routes(ctx: RouterContext, docs: Components) -> APIRouter:
    router = APIRouter()
    server = _Server(ctx)
    cfg, prompter = ctx.cfg, ctx.prompter

    @router.get("/v1/models", responses={200: {"description": "the one model served"}})
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "fluidpd"}],
        }

    @router.post(
        "/v1/completions",
        openapi_extra=docs.body(CompletionRequest),
        response_class=Response,
        responses=SERVING,
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
        max_new = server.budget(body.model, len(ids), body.max_tokens, cfg.default_max_tokens)
        lp = body.logprobs is not None
        sampling = server.sampling(body, max_new, lp, body.logprobs or 0)
        return await server.serve(request, "completions", ids, sampling, body)

    @router.post(
        "/v1/chat/completions",
        openapi_extra=docs.body(ChatCompletionRequest),
        response_class=Response,
        responses=SERVING,
    )
    async def chat(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        if body.top_logprobs and not body.logprobs:
            raise HTTPException(400, "top_logprobs: needs logprobs = true")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        ids = await _tokenized(prompter.chat_prompt_ids(messages))
        if body.max_completion_tokens and body.max_tokens:
            # The one ignored (max_completion_tokens wins, as OpenAI's) is held to its bound too.
            server.budget(body.model, len(ids), body.max_tokens, 256)
        max_tokens = body.max_completion_tokens or body.max_tokens
        max_new = server.budget(body.model, len(ids), max_tokens, 256)
        sampling = server.sampling(body, max_new, body.logprobs, body.top_logprobs or 0)
        return await server.serve(request, "chat", ids, sampling, body)

    return router
