"""Finds the test binaries (the control plane's, helm, prometheus and promtool), building them
once (cached) with build-binaries.sh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "testplane" / "build-binaries.sh"
REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
    "prometheus",
    "promtool",
)


def binaries_ready() -> bool:
    """Whether every binary in REQUIRED is built already (checks only: no build, no lock)."""
    if os.environ.get("FLUIDPD_TESTPLANE_BIN"):
        return True
    proc = subprocess.run(
        ["sh", str(BUILD_SCRIPT)],
        check=False,
        capture_output=True,
        env={**os.environ, "FLUIDPD_TESTPLANE_CHECK": "1"},
    )
    return proc.returncode == 0


def ensure_binaries() -> Path:
    """Return the bin directory holding every binary in REQUIRED.

    `FLUIDPD_TESTPLANE_BIN` names a ready-made directory; otherwise build-binaries.sh runs
    (it only checks the cache when everything is already built, and needs `go` otherwise).
    """
    override = os.environ.get("FLUIDPD_TESTPLANE_BIN")
    if override:
        bin_dir = Path(override)
    else:
        proc = subprocess.run(
            ["sh", str(BUILD_SCRIPT)],
            check=False,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"{BUILD_SCRIPT} failed (exit {proc.returncode}); run `make testplane` to see why"
            )
        bin_dir = Path(lines[-1])
    missing = [name for name in REQUIRED if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeError(f"test plane binaries missing in {bin_dir}: {', '.join(missing)}")
    return bin_dir
