"""Liveness and Prometheus metrics: ``GET /healthz``, ``GET /metrics`` (no token: probes and
scrapers read them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fluidpd.router.context import RouterContext


def routes(ctx: RouterContext) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "Prometheus text exposition",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def prom() -> Response:
        ctx.metrics.retries.set(ctx.dispatcher.retries)
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
