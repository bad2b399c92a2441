"""The router's OpenAPI states the deployment's bounds and what its validators refuse, and a
body is parsed as strictly as its JSON Schema reads (``fluidpd.api.http``)."""

from __future__ import annotations

from typing import Any

import pytest

from fluidpd.api.http import BodyError, parse_json
from fluidpd.api.internal import MAX_RID, Abort, RoleRequest
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.router.app import RouterConfig, create_app
from fluidpd.router.openai_models import CompletionRequest
from fluidpd.router.prompts import Prompter


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    prompter = Prompter(resolve_model_dir(None))
    cfg = RouterConfig(model="served", context_limit=256, workers={})
    return {"vocab": prompter.vocab_size, **create_app(cfg, prompter).openapi()}


def _body(doc: dict[str, Any], path: str) -> dict[str, Any]:
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return dict(schema["properties"])


def test_completions_schema_has_the_deployments_bounds(doc: dict[str, Any]) -> None:
    props = _body(doc, "/v1/completions")
    assert props["model"]["enum"] == ["served"]
    assert props["max_tokens"]["anyOf"][0]["maximum"] == 255
    ids = props["prompt"]["anyOf"][1]
    assert ids["items"]["maximum"] == doc["vocab"] - 1 and ids["maxItems"] == 256
    batch = props["prompt"]["anyOf"][3]
    assert batch["maxItems"] == 1 and batch["items"]["items"]["maximum"] == doc["vocab"] - 1
    assert props["n"]["const"] == 1 and props["echo"]["const"] is False
    chat = _body(doc, "/v1/chat/completions")
    assert chat["max_completion_tokens"]["anyOf"][0]["maximum"] == 255


def test_completions_document_their_statuses_and_content_types(doc: dict[str, Any]) -> None:
    responses = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert set(responses) >= {"200", "400", "404", "502", "503", "504"}
    assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "401" in doc["paths"]["/admin/stats"]["get"]["responses"]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [(b'{"model": "m", "prompt": "x", "max_tokens": true}', "max_tokens"),
     (b'{"model": "m", "prompt": "x", "max_tokens": "3"}', "max_tokens"),
     (b'{"model": "m", "prompt": "x", "top_p": false}', "top_p"),
     (b'{"model": "m", "prompt": "x", "extra": 1}', "extra: unknown"),
     (b"{", "not JSON")],
)  # fmt: skip
def test_bodies_are_as_strict_as_their_schema(raw: bytes, needle: str) -> None:
    with pytest.raises(BodyError, match=needle):
        parse_json(CompletionRequest, raw)


def test_json_schema_integers_and_enum_values_are_taken() -> None:
    body = parse_json(CompletionRequest, b'{"model": "m", "prompt": [1, 2.0], "max_tokens": 4.0}')
    assert body.prompt == [1, 2] and body.max_tokens == 4
    assert parse_json(RoleRequest, b'{"role": "decode"}').role.value == "decode"
    with pytest.raises(BodyError, match="rid"):
        parse_json(Abort, b'{"rid": %d}' % (MAX_RID + 1))
    with pytest.raises(BodyError, match="rid"):
        parse_json(Abort, b'{"rid": 100000000000000000000000}')
