"""Weights: seeded ones are identical across runners; a Hugging Face-named safetensors
directory (with its config.json) loads into the same model and gives the same logits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fluidpd_sidecar.gpu.config import SHAPES, resolve_shape
from fluidpd_sidecar.gpu.profiler import bench_ids
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

OPTS = RunnerOptions(device="cpu", dtype="float32", kv_tokens=1024, max_context=256, max_batch=4)


def _save_hf(runner: ModelRunner, path: Path) -> None:
    from safetensors.torch import save_file  # noqa: PLC0415 - optional dependency

    cfg, w = runner.cfg, runner.weights
    q_n, kv_n = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    sd = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = w.lm_head
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": lw.ln1,
            p + "post_attention_layernorm.weight": lw.ln2,
            p + "self_attn.q_proj.weight": lw.wqkv[:q_n],
            p + "self_attn.k_proj.weight": lw.wqkv[q_n : q_n + kv_n],
            p + "self_attn.v_proj.weight": lw.wqkv[q_n + kv_n :],
            p + "self_attn.o_proj.weight": lw.wo,
            p + "mlp.gate_proj.weight": lw.w_gate_up[: cfg.intermediate],
            p + "mlp.up_proj.weight": lw.w_gate_up[cfg.intermediate :],
            p + "mlp.down_proj.weight": lw.w_down,
        }
        if lw.q_norm is not None and lw.k_norm is not None:
            sd[p + "self_attn.q_norm.weight"] = lw.q_norm
            sd[p + "self_attn.k_norm.weight"] = lw.k_norm
    save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(path / "model.safetensors"))
    hf = {"architectures": ["Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"],
          **cfg.to_hf_config()}  # fmt: skip
    (path / "config.json").write_text(json.dumps(hf))


def test_seeded_weights_are_identical_and_seed_dependent() -> None:
    a, b = ModelRunner(SHAPES["tiny-llama"], OPTS), ModelRunner(SHAPES["tiny-llama"], OPTS)
    assert all(
        torch.equal(x, y) for x, y in zip(a.weights.tensors(), b.weights.tensors(), strict=True)
    )
    c = ModelRunner(SHAPES["tiny-llama"], replace(OPTS, seed=1))
    assert not torch.equal(a.weights.embed, c.weights.embed)


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_safetensors_directory_loads_the_same_model(shape: str, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    seeded = ModelRunner(SHAPES[shape], OPTS)
    _save_hf(seeded, tmp_path)
    cfg = resolve_shape(str(tmp_path))
    assert (cfg.layers, cfg.kv_heads, cfg.qk_norm, cfg.rope_scaling) == (
        seeded.cfg.layers, seeded.cfg.kv_heads, seeded.cfg.qk_norm, seeded.cfg.rope_scaling,
    )  # fmt: skip
    loaded = ModelRunner(cfg, replace(OPTS, model_dir=str(tmp_path), seed=99))
    ids = bench_ids(50, cfg.vocab, 3)
    assert torch.allclose(seeded.prefill(1, ids), loaded.prefill(1, ids), atol=1e-5)
