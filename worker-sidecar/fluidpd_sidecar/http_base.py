"""What every worker sidecar's HTTP surface shares, whichever engine it wraps (``app.py`` for
the sim and gpu engines, ``sglang/app.py``): the lifespan that starts and stops its service,
the bearer-token dependency, the error mapping, and the health, readiness, pressure, metrics
and role routes the router, controller, operator and dashboards read."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fluidpd import __version__
from fluidpd.api.internal import PressureReport, RoleStatus
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound


class _Config(Protocol):
    @property
    def worker_id(self) -> str: ...
    @property
    def admin_token(self) -> str | None: ...


class _Metrics(Protocol):
    @property
    def registry(self) -> CollectorRegistry: ...


class WorkerService(Protocol):
    """The part of a sidecar service the shared routes use."""

    @property
    def cfg(self) -> _Config: ...
    @property
    def metrics(self) -> _Metrics: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def pressure(self, n_prefill: int | None = None) -> PressureReport: ...
    def role_status(self) -> RoleStatus: ...


def worker_app(
    service: WorkerService, title: str, ready: Callable[[], tuple[bool, str]]
) -> tuple[FastAPI, Any]:
    """The app with the shared routes, and the dependency that gates a route on the token.

    ``ready`` says whether the worker takes work, and why not (``/readyz``'s 503 body)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        token = service.cfg.admin_token
        if not token:
            return
        expected = f"Bearer {token}"
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(401, "missing or wrong bearer token")

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": exc.args[0] if exc.args else "not found"}, status_code=404)

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
        ok, why = ready()
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

    return app, Depends(admin)
