"""Builds a ``GpuEngine`` sized by a profile (the sidecar's and the profiler's entry point).

The model is either a Hugging Face model directory (``model_dir``: shape from its
``config.json``, weights from its safetensors) or, for benchmarks, a named shape with seeded
random weights (``shape`` + ``seed``); the two are never mixed.
"""

from __future__ import annotations

from collections.abc import Sequence

from fluidpd.core.profile import Profile
from fluidpd.core.types import Role
from fluidpd_sidecar.engine import KVStaging
from fluidpd_sidecar.gpu.checkpoint import model_dir_config
from fluidpd_sidecar.gpu.config import ModelConfig, resolve_shape
from fluidpd_sidecar.gpu.engine import GpuEngine
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

PAGE_SIZE = 16
MAX_GRAPH_BATCH = 256


def model_config(shape: str | None, model_dir: str | None) -> ModelConfig:
    """The model's shape: the directory's ``config.json`` if given, else the named shape."""
    if model_dir:
        return model_dir_config(model_dir)
    if not shape:
        raise ValueError("no model: give a model directory or an --engine-model shape")
    return resolve_shape(shape)


def runner_options(
    profile: Profile,
    device: str,
    dtype: str,
    seed: int,
    model_dir: str | None,
    output_ids: Sequence[int] | None = None,
) -> RunnerOptions:
    """KV pool = the profile's capacity plus one page of rounding per running request, so the
    scheduler's token accounting (which knows no pages) never finds the pool short."""
    max_batch = min(profile.max_running_requests, MAX_GRAPH_BATCH)
    return RunnerOptions(
        device=device,
        dtype=dtype,
        seed=seed,
        model_dir=model_dir,
        kv_tokens=profile.kv.capacity_tokens + PAGE_SIZE * max_batch,
        page_size=PAGE_SIZE,
        max_context=profile.context_limit,
        max_batch=max_batch,
        output_ids=None if output_ids is None else tuple(output_ids),
    )


def build_engine(
    shape: str | None,
    profile: Profile,
    role: Role,
    *,
    model_dir: str | None = None,
    device: str = "cuda",
    dtype: str = "bfloat16",
    seed: int = 0,
    staging: KVStaging | None = None,
    text_ids: Sequence[int] | None = None,
) -> GpuEngine:
    """``model_dir`` set: that checkpoint (``shape`` is ignored); else ``shape`` with weights
    drawn from ``seed``. Raises ValueError (``ModelDirError``) with one line naming the file.

    ``text_ids``: the ids the served tokenizer renders as text by themselves
    (``TokenText.text_ids``). Seeded weights output only these, as the ``sim`` engine does: their
    logits are noise over the shape's whole vocabulary (128K ids for Llama-3), the served
    tokenizer is then the embedded 1,024-id one, and an id it does not know streams no text, so
    a client timing the first token by its text (``fluidpd replay``, SGLang's bench_serving)
    would wait for the first id below 1,024. A checkpoint's outputs are left alone."""
    cfg = model_config(shape, model_dir)
    if profile.kv.bytes_per_token != cfg.kv_bytes_per_token and dtype == "bfloat16":
        raise ValueError(
            f"profile {profile.name}: kv.bytes_per_token {profile.kv.bytes_per_token} is not "
            f"the {cfg.kv_bytes_per_token} B of model shape {cfg.name}"
        )
    allowed = None if model_dir else text_ids
    runner = ModelRunner(cfg, runner_options(profile, device, dtype, seed, model_dir, allowed))
    return GpuEngine(runner, role, staging)
