"""The router's OpenAPI: the hand-parsed bodies (``fluidpd.api.http``) with the deployment's
bounds (the served model's name, its vocabulary, its context limit), and the responses each
OpenAI route answers with."""

from __future__ import annotations

from typing import Any

from fluidpd.api.http import OPENAI_ERROR, Components, errors, token_bounds
from fluidpd.router.config import RouterConfig

#: ``responses=`` of the completions routes (200: JSON, or an SSE stream when ``stream``).
SERVING: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion (JSON), or with stream: true its chunks as server-sent "
        "events ending with data: [DONE]",
        "content": {
            "application/json": {"schema": {"type": "object", "required": ["id", "choices"]}},
            # Each event: a chunk as JSON in ``data``, an error object, or ``[DONE]``.
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string"}},
                }
            },
        },
    },
    **errors(
        OPENAI_ERROR,
        s400="invalid request, the field named; or prompt tokens + max_tokens over the "
        "context limit (context_length_exceeded), or messages the chat template refuses",
        s404="the model is not served here",
        s502="a worker failed the request after it started",
        s503="no prefill/decode pair could take the request",
        s504="no first token within the router's first-token timeout",
    ),
}


def components(cfg: RouterConfig, vocab: int) -> Components:
    """Request bodies of this router, with its model, vocabulary and context limit."""
    bounds = token_bounds(
        vocab, cfg.context_limit,
        {"CompletionRequest": ("prompt", "stop_token_ids"),
         "ChatCompletionRequest": ("stop_token_ids",)},
        {"CompletionRequest": ("max_tokens",),
         "ChatCompletionRequest": ("max_tokens", "max_completion_tokens")},
    )  # fmt: skip

    def patch(models: dict[str, Any]) -> None:
        bounds(models)
        for name in ("CompletionRequest", "ChatCompletionRequest"):
            props = models.get(name, {}).get("properties", {})
            if "model" in props:
                props["model"]["enum"] = [cfg.model]

    return Components(patch)
