"""Builds a ``GpuEngine`` sized by a profile (the sidecar's and the profiler's entry point)."""

from __future__ import annotations

from fluidpd.core.profile import Profile
from fluidpd.core.types import Role
from fluidpd_sidecar.engine import KVStaging
from fluidpd_sidecar.gpu.config import resolve_shape
from fluidpd_sidecar.gpu.engine import GpuEngine
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

PAGE_SIZE = 16
MAX_GRAPH_BATCH = 256


def runner_options(
    profile: Profile, device: str, dtype: str, seed: int, weights_dir: str | None
) -> RunnerOptions:
    """KV pool = the profile's capacity plus one page of rounding per running request, so the
    scheduler's token accounting (which knows no pages) never finds the pool short."""
    max_batch = min(profile.max_running_requests, MAX_GRAPH_BATCH)
    return RunnerOptions(
        device=device,
        dtype=dtype,
        seed=seed,
        weights_dir=weights_dir,
        kv_tokens=profile.kv.capacity_tokens + PAGE_SIZE * max_batch,
        page_size=PAGE_SIZE,
        max_context=profile.context_limit,
        max_batch=max_batch,
    )


def build_engine(
    shape: str,
    profile: Profile,
    role: Role,
    *,
    device: str = "cuda",
    dtype: str = "bfloat16",
    seed: int = 0,
    weights_dir: str | None = None,
    staging: KVStaging | None = None,
) -> GpuEngine:
    cfg = resolve_shape(shape)
    if profile.kv.bytes_per_token != cfg.kv_bytes_per_token and dtype == "bfloat16":
        raise ValueError(
            f"profile {profile.name}: kv.bytes_per_token {profile.kv.bytes_per_token} is not "
            f"the {cfg.kv_bytes_per_token} B of model shape {cfg.name}"
        )
    runner = ModelRunner(cfg, runner_options(profile, device, dtype, seed, weights_dir))
    return GpuEngine(runner, role, staging)
