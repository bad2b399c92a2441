"""OpenAPI for the handlers that parse their own bodies (the hot OpenAI routes validate raw
bytes with pydantic instead of FastAPI's parse-then-validate, so FastAPI cannot see their
request models)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

#: Nested models of those bodies, merged into the document's shared components.
_SCHEMAS: dict[str, Any] = {}


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI request body for a handler that parses its body itself."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    for name, sub in defs.items():
        _SCHEMAS[name] = sub
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def install(app: FastAPI) -> None:
    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        schema = base_openapi()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(_SCHEMAS)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
