"""How the router's and the sidecars' HTTP surfaces parse and document JSON bodies.

A body is validated straight from its bytes in pydantic's strict JSON mode, so what is
accepted is exactly what its JSON Schema allows: ``true`` or ``"1"`` is not an integer, ``1``
is a number, an enum takes its JSON value. (FastAPI's own body parsing validates the decoded
Python objects in lax mode, which takes ``false`` for ``0`` and ``"7"`` for ``7``.) The handler
then cannot show FastAPI the model, so the OpenAPI request body is given explicitly, with the
body's nested models added to the document's shared components.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class BodyError(ValueError):
    """A body that does not match its schema; the message is one line naming the field."""


def first_error(errors: Sequence[Any]) -> str:
    """Pydantic's first error as one line that starts with the field's name."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if first.get("type") == "extra_forbidden":
        msg = "unknown or unsupported field"
    elif first.get("type") == "json_invalid":
        msg = "the body is not JSON"
    else:
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _integral(value: Any) -> Any:
    """JSON Schema's integers include ``1.0``; pydantic's strict mode takes only ``1``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def parse_json(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = exc.errors()
    if any(e["type"] == "int_type" and isinstance(e.get("input"), float) for e in errors):
        # Rare (clients send 7, not 7.0), so the hot path never pays for this second parse.
        # json, not orjson: it takes integers beyond 64 bits (then refused by their bounds).
        again = json.dumps(_integral(json.loads(raw))).encode()
        try:
            return model.model_validate_json(again, strict=True)
        except ValidationError as exc:
            errors = exc.errors()
    raise BodyError(first_error(errors))


class Components:
    """The nested models of hand-parsed bodies, for one app's OpenAPI document."""

    def __init__(self, patch: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``patch`` edits a body's schema and its nested models in place (bounds known only
        when the app is made)."""
        self.schemas: dict[str, Any] = {}
        self._patch = patch

    def body(self, model: type[BaseModel]) -> dict[str, Any]:
        """``openapi_extra`` for a route whose handler parses ``model`` itself."""
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        defs = schema.pop("$defs", {})
        if self._patch is not None:
            self._patch({model.__name__: schema, **defs})
        self.schemas.update(defs)
        return {
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}
        }

    def install(self, app: FastAPI) -> None:
        base_openapi = app.openapi

        def openapi() -> dict[str, Any]:
            doc = base_openapi()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(self.schemas)
            return doc

        app.openapi = openapi  # type: ignore[method-assign]


#: An error body as both surfaces answer it: OpenAI's shape on the router.
OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": "integer"},
            },
        }
    },
}
#: ...and ``{"detail": "one line"}`` on a sidecar.
DETAIL_ERROR = {
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"type": "string"}},
}


def errors(schema: dict[str, Any], **described: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries: status -> description, each with the error body's schema."""
    return {
        int(status.removeprefix("s")): {
            "description": text,
            "content": {"application/json": {"schema": schema}},
        }
        for status, text in described.items()
    }


def bound_ints(schema: dict[str, Any], **keywords: Any) -> None:
    """Adds ``keywords`` (``maximum``, ...) to every integer schema in ``schema``: itself, its
    array items and its ``anyOf`` branches, at any depth."""
    if schema.get("type") == "integer":
        schema.update(keywords)
    if isinstance(schema.get("items"), dict):
        bound_ints(schema["items"], **keywords)
    for branch in schema.get("anyOf", ()):
        bound_ints(branch, **keywords)


def token_bounds(
    vocab: int,
    context_limit: int,
    ids: Mapping[str, Sequence[str]],
    lengths: Mapping[str, Sequence[str]],
) -> Callable[[dict[str, Any]], None]:
    """A ``Components.body`` patch that states a served model's bounds: the fields
    ``ids[model]`` hold token ids (``[0, vocab)``, at most ``context_limit`` of them) and
    ``lengths[model]`` are token budgets (at most ``context_limit - 1``: a prompt has one)."""

    def patch(models: dict[str, Any]) -> None:
        for name, fields in ids.items():
            props = models.get(name, {}).get("properties", {})
            for field in fields:
                if field in props:
                    bound_ints(props[field], minimum=0, maximum=vocab - 1)
                    for array in (props[field], *props[field].get("anyOf", ())):
                        if array.get("type") == "array":
                            array["maxItems"] = min(array.get("maxItems", context_limit),
                                                    context_limit)  # fmt: skip
        for name, fields in lengths.items():
            props = models.get(name, {}).get("properties", {})
            for field in fields:
                if field in props:
                    bound_ints(props[field], maximum=context_limit - 1)

    return patch


_BEARER = HTTPBearer(auto_error=False, description="the deployment's admin token")


def _open() -> None:
    """No admin token configured: the routes are open (and the document claims no scheme)."""


def bearer_gate(token: str | None) -> Any:
    """The dependency that gates a route on ``Authorization: Bearer <token>`` (401 with
    ``WWW-Authenticate`` otherwise); it also puts the HTTP bearer scheme in the OpenAPI, so a
    client (and schemathesis' ``ignored_auth``) knows which routes need the token."""
    if not token:
        return Depends(_open)
    expected = token.encode()

    def admin(creds: HTTPAuthorizationCredentials | None = Depends(_BEARER)) -> None:  # noqa: B008
        # Bytes: compare_digest refuses non-ASCII str, and a header may hold any latin-1 byte.
        if creds is None or not hmac.compare_digest(creds.credentials.encode(), expected):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return Depends(admin)
