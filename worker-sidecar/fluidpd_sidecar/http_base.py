"""What every worker sidecar's HTTP surface shares, whichever engine it wraps (``app.py`` for
the sim and gpu engines, ``sglang/app.py``): the lifespan that starts and stops its service,
the bearer-token dependency, strict JSON bodies (``fluidpd.api.http``), the error mapping
(``{"detail": "one line"}``; 405 with every method the path has in ``Allow``), and the health,
readiness, pressure, metrics and role routes the router, controller, operator and dashboards
read. Each route's OpenAPI lists the statuses it answers with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from fluidpd import __version__
from fluidpd.api.http import (
    DETAIL_ERROR,
    BodyError,
    Components,
    bearer_gate,
    errors,
    first_error,
    parse_json,
)
from fluidpd.api.internal import PressureReport, RetireRequest, RoleRequest, RoleStatus
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound

M = TypeVar("M", bound=BaseModel)

#: ``responses=`` of a token-gated route, and of one with a JSON body.
UNAUTHORIZED = errors(DETAIL_ERROR, s401="missing or wrong bearer token")
INVALID = errors(DETAIL_ERROR, s422="the body does not match its schema (the field named)")
TEXT = {"text/plain": {"schema": {"type": "string"}}}


def detail(**described: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries with the sidecar's error body, e.g. ``detail(s409="...")``."""
    return errors(DETAIL_ERROR, **described)


def _allowed(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of this path takes (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**request.scope, "method": "\x00"})
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


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
    def request_role(self, body: RoleRequest) -> RoleStatus: ...
    def retire(self, body: RetireRequest) -> RoleStatus: ...
    def cancel_retire(self) -> RoleStatus: ...


class Bodies:
    """Strict JSON request bodies of one app, documented in its OpenAPI."""

    def __init__(self, app: FastAPI, patch: Callable[[dict[str, Any]], None] | None) -> None:
        self._components = Components(patch)
        self._components.install(app)

    def __call__(self, model: type[M]) -> tuple[Any, dict[str, Any]]:
        """The dependency that parses ``model`` from the body, and the route's
        ``openapi_extra``."""

        async def parse(request: Request) -> M:
            try:
                return parse_json(model, await request.body())
            except BodyError as exc:
                raise HTTPException(422, str(exc)) from None

        return Depends(parse), self._components.body(model)


def worker_app(
    service: WorkerService,
    title: str,
    ready: Callable[[], tuple[bool, str]],
    patch: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[FastAPI, Any, Bodies]:
    """The app with the shared routes, the dependency that gates a route on the token, and
    the request bodies' parser.

    ``ready`` says whether the worker takes work, and why not (``/readyz``'s 503 body);
    ``patch`` adds this worker's bounds (vocabulary, context limit) to the bodies' schemas."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": exc.args[0] if exc.args else "not found"}, status_code=404)

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": first_error(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed(app, request))
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code, headers=headers)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get(
        "/readyz",
        response_class=PlainTextResponse,
        responses={
            200: {"description": "Active in its role: takes work", "content": TEXT},
            503: {
                "description": "not ready: draining, switching or retiring (the state named)",
                "content": TEXT,
            },
        },
    )
    async def readyz() -> Response:
        ok, why = ready()
        return PlainTextResponse(why if ok else f"not ready: {why}", status_code=200 if ok else 503)

    @app.get("/pressure", responses=detail(s422="n_prefill out of range"))
    async def pressure(
        n_prefill: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> PressureReport:
        return service.pressure(n_prefill)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text exposition", "content": TEXT}},
    )
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    admin = bearer_gate(service.cfg.admin_token)
    bodies = Bodies(app, patch)
    role_body, role_doc = bodies(RoleRequest)
    retire_body, retire_doc = bodies(RetireRequest)
    switching = detail(s409="a switch or a retirement is under way")
    # (Bodies as defaults, not ``Annotated[..., role_body]``: this module's annotations are
    # strings, and FastAPI resolves them in the module, where these locals are not.)

    @app.get("/role")
    async def get_role() -> RoleStatus:
        return service.role_status()

    @app.post("/role", dependencies=[admin], openapi_extra=role_doc,
              responses={**UNAUTHORIZED, **INVALID, **switching})  # fmt: skip
    async def post_role(req: RoleRequest = role_body) -> RoleStatus:
        return service.request_role(req)

    @app.post("/retire", dependencies=[admin], openapi_extra=retire_doc,
              responses={**UNAUTHORIZED, **INVALID, **switching})  # fmt: skip
    async def post_retire(req: RetireRequest = retire_body) -> RoleStatus:
        return service.retire(req)

    @app.delete("/retire", dependencies=[admin], responses=UNAUTHORIZED)
    async def delete_retire() -> RoleStatus:
        """Calls off a retirement: the worker returns to service in its role (idempotent)."""
        return service.cancel_retire()

    return app, admin, bodies
