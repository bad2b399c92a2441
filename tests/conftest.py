"""Shared fixtures: the real ``helm`` binary (built by ``e2e/testplane/build-binaries.sh``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def find_helm() -> str | None:
    """``$FLUIDPD_HELM``, then the test plane's cache (newest build), then ``helm`` on PATH."""
    explicit = os.environ.get("FLUIDPD_HELM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    cache = Path(os.environ.get("FLUIDPD_CACHE_DIR", Path.home() / ".cache" / "fluidpd"))
    built = sorted(
        (p for p in cache.glob("testplane/*/bin/helm") if os.access(p, os.X_OK)),
        key=lambda p: p.stat().st_mtime,
    )
    if built:
        return str(built[-1])
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm_or_none() -> str | None:
    return find_helm()


@pytest.fixture(scope="session")
def helm(helm_or_none: str | None) -> str:
    found = helm_or_none
    if found is None:
        pytest.skip("no helm binary: run `sh e2e/testplane/build-binaries.sh` (make test does)")
    return found
