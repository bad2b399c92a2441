"""SGLang's own CPU venv for the tests that run real SGLang servers (``tests/sglang``, the e2e
backend test): made once and cached by ``scripts/sglang/mkvenv.sh``, which returns at once when
it is built."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sglang_python() -> str:
    """The venv's interpreter (building the venv first when it is missing or stale)."""
    out = subprocess.run(
        ["sh", str(ROOT / "scripts/sglang/mkvenv.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert out.returncode == 0, f"mkvenv.sh failed: {out.stderr[-2000:]}"
    return out.stdout.strip().splitlines()[-1]
