"""Fixtures for the SGLang tests: ``sglang_python``, the interpreter of SGLang's own CPU venv
(made once, cached, by ``scripts/sglang/mkvenv.sh``; it returns at once when it is built)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sglang_python() -> str:
    out = subprocess.run(
        ["sh", str(ROOT / "scripts/sglang/mkvenv.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert out.returncode == 0, f"mkvenv.sh failed: {out.stderr[-2000:]}"
    return out.stdout.strip().splitlines()[-1]
