"""Shared fixtures: the real ``helm`` binary (built by ``e2e/testplane/build-binaries.sh``), and
synthetic Hugging Face model directories (``fluidpd.modeldir.synthetic``) built once per session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fluidpd.modeldir.synthetic import write_model
from harness.binaries import ensure_binaries


def find_helm() -> str | None:
    """``$FLUIDPD_HELM``, then the test plane's cache (newest build), then ``helm`` on PATH,
    else the test binaries are built (``ensure_binaries``: waits for a build already running,
    as under ``make test``, where it runs alongside the tests)."""
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
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    try:
        return str(ensure_binaries(("helm",)) / "helm")
    except RuntimeError:
        return None


@pytest.fixture(scope="session")
def helm_or_none() -> str | None:
    return find_helm()


@pytest.fixture(scope="session")
def helm(helm_or_none: str | None) -> str:
    found = helm_or_none
    if found is None:
        pytest.skip("no helm binary: run `sh e2e/testplane/build-binaries.sh` (make test does)")
    return found


@pytest.fixture(scope="session")
def model_dir_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Builds (once per argument set and session) a model directory with ``write_model``."""
    built: dict[tuple[tuple[str, object], ...], Path] = {}

    def build(**kwargs: object) -> Path:
        key = tuple(sorted(kwargs.items()))
        if key not in built:
            out = tmp_path_factory.mktemp("model")
            write_model(out, **kwargs)  # type: ignore[arg-type]
            built[key] = out
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_llama_dir(model_dir_factory: Callable[..., Path]) -> Path:
    """A tiny ``LlamaForCausalLM`` (seed 0) with a byte-level BPE tokenizer and chat template."""
    pytest.importorskip("transformers")
    return model_dir_factory(arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(model_dir_factory: Callable[..., Path]) -> Path:
    """A tiny ``Qwen3ForCausalLM`` (seed 0), byte-fallback tokenizer, sharded safetensors."""
    pytest.importorskip("transformers")
    return model_dir_factory(arch="qwen3", tokenizer="bytefallback", max_shard_size="100KB")
