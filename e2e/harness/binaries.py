"""Finds the test binaries (the control plane's, helm, prometheus and promtool), building them
once (cached) with build-binaries.sh.

A caller names what it needs: while a cold ``make test`` builds everything in the background,
a test that needs only helm starts as soon as helm is in the bin dir, without waiting for the
control plane and Prometheus (each binary appears there by a rename, complete)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "testplane" / "build-binaries.sh"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
REQUIRED = (*CONTROL_PLANE, "helm", "prometheus", "promtool")
#: How often a test waiting on another process's build looks again.
POLL_S = 5.0


def _need(names: Iterable[str]) -> str:
    return " ".join(names)


def _check(names: Iterable[str]) -> tuple[bool, Path]:
    """Whether ``names`` are built, and the bin dir (no build, no lock)."""
    proc = subprocess.run(
        ["sh", str(BUILD_SCRIPT)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "FLUIDPD_TESTPLANE_CHECK": "1", "FLUIDPD_TESTPLANE_NEED": _need(names)},
    )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{BUILD_SCRIPT} printed no bin dir: {proc.stderr[-500:]}")
    return proc.returncode == 0, Path(lines[-1])


def _building(bin_dir: Path) -> bool:
    """Whether another process holds the build's lock (build-binaries.sh takes it by flock)."""
    lock = bin_dir.parent / ".build.lock"
    if not lock.exists():
        return False
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def binaries_ready(names: Iterable[str] = REQUIRED) -> bool:
    """Whether ``names`` are built already (checks only: no build, no lock)."""
    if os.environ.get("FLUIDPD_TESTPLANE_BIN"):
        return True
    return _check(names)[0]


def ensure_binaries(names: Iterable[str] = REQUIRED) -> Path:
    """Return the bin directory holding ``names`` (default: all of REQUIRED).

    `FLUIDPD_TESTPLANE_BIN` names a ready-made directory. Otherwise, while another process
    builds, wait until ``names`` are there or that build ends; then build what is still missing
    of them (build-binaries.sh only checks the cache when they are built; it needs `go`
    otherwise).
    """
    names = tuple(names)
    override = os.environ.get("FLUIDPD_TESTPLANE_BIN")
    if override:
        bin_dir = Path(override)
    else:
        ready, bin_dir = _check(names)
        while not ready and _building(bin_dir):
            time.sleep(POLL_S)
            ready, bin_dir = _check(names)
        if not ready:
            proc = subprocess.run(
                ["sh", str(BUILD_SCRIPT)],
                check=False,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "FLUIDPD_TESTPLANE_NEED": _need(names)},
            )
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise RuntimeError(
                    f"{BUILD_SCRIPT} failed (exit {proc.returncode}); run `make testplane` to see "
                    "why"
                )
            bin_dir = Path(lines[-1])
    missing = [name for name in names if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeError(f"test plane binaries missing in {bin_dir}: {', '.join(missing)}")
    return bin_dir
