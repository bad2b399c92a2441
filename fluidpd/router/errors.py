"""The router's error bodies (OpenAI's ``{"error": {...}}``), one line each, for every error."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from fluidpd.api.http import first_error


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def install(app: FastAPI) -> None:
    """Validation errors are 400s (OpenAI's status for a bad request), not FastAPI's 422."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, first_error(exc.errors()))

    @app.exception_handler(HTTPException)  # FastAPI's and Starlette's (404, 405)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        reply = error(exc.status_code, str(exc.detail))
        reply.headers.update(exc.headers or {})  # 405's Allow
        return reply
