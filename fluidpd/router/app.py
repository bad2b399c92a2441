"""The router's app factory: it wires the route modules (``routes_openai``: completions, chat,
models; ``routes_admin``: ``/admin/*``; ``routes_health``: ``/healthz``, ``/metrics``) to one
shared context, the error bodies and the OpenAPI document (``openapi.py``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI

from fluidpd import __version__
from fluidpd.core.pairing import LeastLoadedPairing, Pairing, RandomPairing, RoundRobinPairing
from fluidpd.core.signals import allocatable_kv
from fluidpd.router import errors, routes_admin, routes_health, routes_openai
from fluidpd.router.config import RouterConfig
from fluidpd.router.context import RouterContext
from fluidpd.router.dispatch import Dispatcher
from fluidpd.router.openapi import components
from fluidpd.router.prompts import Prompter
from fluidpd.router.workers import WorkerInfo, WorkerSet

__all__ = ["RouterConfig", "create_app"]


def _free_kv(pressure: dict[str, Any]) -> float:
    """A decode worker's allocatable KV from its last /pressure report (eq. 6, the core's)."""
    get = pressure.get
    return float(allocatable_kv(get("kv_capacity", 0), get("kv_used", 0), get("kv_reserved", 0)))


def _backlog(info: WorkerInfo) -> float:
    """A prefill worker's queued requests: its last report's and those routed since."""
    return float(info.pressure.get("queue_len", 0) + len(info.unreported))


def _room(info: WorkerInfo) -> float:
    """A decode worker's free KV: its last report's, less the prompts routed to it since."""
    return _free_kv(info.pressure) - info.unreported_tokens


def _worker_set(cfg: RouterConfig) -> WorkerSet:
    pairing: Pairing
    if cfg.pairing == "least-loaded":
        pairing = LeastLoadedPairing(
            prefill_backlog=lambda w: _backlog(workers.workers[w]),
            decode_free_kv=lambda w: _room(workers.workers[w]),
        )
    elif cfg.pairing == "random":
        pairing = RandomPairing(random.Random().randrange)
    else:
        pairing = RoundRobinPairing()
    workers = WorkerSet(pairing, cfg.poll_s, cfg.admin_token)
    workers.set(cfg.workers)
    return workers


def create_app(cfg: RouterConfig, prompter: Prompter) -> FastAPI:
    """``prompter``: the served model's tokenizer and chat template (loaded by the caller, so
    a bad model directory fails at start with one line)."""
    ctx = RouterContext(cfg, prompter, _worker_set(cfg))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=2.0)
        )
        dispatcher = Dispatcher(ctx.workers, session, cfg.admin_token, cfg.first_token_timeout_s)
        ctx.attach(dispatcher)
        await ctx.workers.start(session)
        yield
        await dispatcher.settle(dispatcher.abort_timeout_s)
        await ctx.workers.stop()
        await session.close()
        prompter.close()

    app = FastAPI(title="FluidPD router", version=__version__, lifespan=lifespan)
    app.include_router(routes_health.routes(ctx))
    docs = components(cfg, prompter.vocab_size)
    app.include_router(routes_openai.routes(ctx, docs))
    app.include_router(routes_admin.routes(ctx))
    errors.install(app)
    docs.install(app)
    return app
