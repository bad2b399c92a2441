"""Schemathesis fuzzes the sidecar's and the router's OpenAPI specs: no 5xx, no hang.

Both run on a synthetic fast profile with a small context limit, so a fuzzed request that is
valid (and therefore really served) finishes in well under a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fluidpd.cli.drill_cmd import FAST_PROFILE
from fluidpd.drills.stack import free_port_block, wait_http

TOKEN = "schema-token"


@pytest.fixture(scope="module")
def fast_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "serving-path.yaml"
    path.write_text(FAST_PROFILE.replace("context_limit: 32768", "context_limit: 2048"))
    return path


def schemathesis(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("schemathesis")
    assert exe, "schemathesis is not installed (pip install -e '.[dev]')"
    return subprocess.run(
        [exe, "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
         "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", "20",
         "--request-timeout", "10", "--phases", "examples,coverage,fuzzing", "--seed", "1",
         *extra],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sidecar(fast_profile: Path) -> Iterator[str]:
    port = free_port_block(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fluidpd.cli.main", "sidecar", "--id", "fuzz", "--role", "prefill",
         "--port", str(port), "--profile", str(fast_profile), "--bootstrap-timeout", "2"],
        env={**os.environ, "FLUIDPD_ADMIN_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_sidecar_api_has_no_server_errors(sidecar: str) -> None:
    # POST /retire is one-way (a retiring worker waits to be deleted and /readyz answers its
    # documented 503 from then on), so it is fuzzed last, on its own.
    result = schemathesis(sidecar, "--exclude-path", "/retire")
    assert result.returncode == 0, result.stdout[-4000:]
    result = schemathesis(sidecar, "--include-path", "/retire")
    assert result.returncode == 0, result.stdout[-4000:]


def test_router_api_has_no_server_errors(
    stack_factory: Callable[..., Any], fast_profile: Path
) -> None:
    stack = stack_factory("1P1D", "static", "--profile", str(fast_profile), "--noise", "0")
    result = schemathesis(stack.endpoint)
    assert result.returncode == 0, result.stdout[-4000:]
