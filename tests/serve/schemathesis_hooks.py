"""Schemathesis hooks for FluidPD's APIs (``SCHEMATHESIS_HOOKS=tests/serve/schemathesis_hooks.py``).

One check replaces schemathesis' ``positive_data_acceptance`` (run with ``--exclude-checks
positive_data_acceptance``): it is the same check, except for the few rules of these APIs that
JSON Schema cannot state, each a relation between fields or with the served model, each
documented in the route's 400/422 description. A request that breaks only such a rule is
schema-valid and still refused; the check lets exactly those refusals pass, recognised by their
one-line message, and fails on any other refusal of a schema-valid request.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

#: (status, message pattern, why JSON Schema cannot state it).
CROSS_FIELD_RULES = (
    # The router: prompt tokens (a string's count depends on the tokenizer) + max_tokens.
    (400, r"^prompt: \d+ tokens; the context limit is \d+$", "tokenized prompt length"),
    (400, r"^max_(completion_)?tokens: \d+ \+ prompt \d+ tokens exceed the context limit",
     "prompt length + max_tokens"),
    # The served model's chat template (Jinja) has rules of its own, e.g. role order.
    (400, r"^messages: the chat template refused them", "the model's chat template"),
    # The router's worker set: two workers with one URL (JSON Schema has no unique values).
    (400, r"^workers: two workers share one URL$", "distinct values of an object"),
    # A sidecar: prompt_ids length + sampling.max_new_tokens.
    (400, r"^prompt_ids: \d+ tokens \+ max_new_tokens \(\d+\) exceed the context limit",
     "len(prompt_ids) + max_new_tokens"),
    # A hand-off of the whole prompt carries its first token (prefix_tokens vs prompt length).
    (400, r"the whole prompt was handed off without its first token$",
     "prefix_tokens == len(prompt_ids) of the request held"),
    # An adopted request's output_ids number `generated`.
    (422, r"^output_ids: \d+ ids for \d+$", "len(output_ids) == generated"),
)  # fmt: skip


def _message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    if isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body.get("detail", ""))


def breaks_only_a_cross_field_rule(response: Any) -> bool:
    message = _message(response)
    return any(
        response.status_code == status and re.search(pattern, message)
        for status, pattern, _ in CROSS_FIELD_RULES
    )


@schemathesis.check
def positive_data_acceptance_but_cross_field_rules(
    ctx: Any, response: Any, case: Any
) -> bool | None:
    """Schemathesis' positive_data_acceptance, save the refusals ``CROSS_FIELD_RULES`` name."""
    if breaks_only_a_cross_field_rule(response):
        return None
    return positive_data_acceptance(ctx, response, case)
