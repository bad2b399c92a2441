"""The gpu engine's model against transformers' reference implementation, same weights.

For each shape, the engine's seeded weights are copied (unfused) into transformers'
``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` built from the same hyperparameters, and the
last-position logits of one prompt are compared (max abs error relative to the largest
logit, greedy token). This checks the architecture itself: RoPE layout and Llama-3
frequency scaling, GQA, qk-norm, tied heads. Writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

import torch

from fluidpd_sidecar.gpu.config import ModelConfig, resolve_shape
from fluidpd_sidecar.gpu.profiler import bench_ids
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions


def hf_model(cfg: ModelConfig, runner: ModelRunner) -> Any:
    import transformers as tf  # noqa: PLC0415 - only on the GPU machine

    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_eps,
        tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_position,
    )  # fmt: skip
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rs = cfg.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor, "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position}  # fmt: skip
    cls_cfg = tf.Qwen3Config if cfg.qk_norm else tf.LlamaConfig
    try:
        hf_cfg = cls_cfg(**common, rope_parameters=rope)
    except TypeError:
        hf_cfg = cls_cfg(**common, rope_theta=cfg.rope_theta, rope_scaling=rope)
    cls = tf.Qwen3ForCausalLM if cfg.qk_norm else tf.LlamaForCausalLM
    with torch.device(runner.device):  # initialise on the GPU: an 8B model on CPU is slow
        model = cls(hf_cfg).to(dtype=runner.dtype).eval()
    w = runner.weights
    q_n, kv_n = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    sd: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.norm,
    }
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = w.lm_head
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = lw.ln1
        sd[p + "post_attention_layernorm.weight"] = lw.ln2
        sd[p + "self_attn.q_proj.weight"] = lw.wqkv[:q_n]
        sd[p + "self_attn.k_proj.weight"] = lw.wqkv[q_n : q_n + kv_n]
        sd[p + "self_attn.v_proj.weight"] = lw.wqkv[q_n + kv_n :]
        sd[p + "self_attn.o_proj.weight"] = lw.wo
        if lw.q_norm is not None and lw.k_norm is not None:
            sd[p + "self_attn.q_norm.weight"] = lw.q_norm
            sd[p + "self_attn.k_norm.weight"] = lw.k_norm
        sd[p + "mlp.gate_proj.weight"] = lw.w_gate_up[: cfg.intermediate]
        sd[p + "mlp.up_proj.weight"] = lw.w_gate_up[cfg.intermediate :]
        sd[p + "mlp.down_proj.weight"] = lw.w_down
    missing, unexpected = model.load_state_dict(sd, strict=False)
    bad = [k for k in missing if "rotary" not in k and not (cfg.tie_embeddings and "lm_head" in k)]
    if bad or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {bad}, unexpected {unexpected}")
    if cfg.tie_embeddings:
        model.tie_weights()
    return model


def check(shape: str, dtype: str, length: int) -> dict[str, Any]:
    cfg = resolve_shape(shape)
    opts = RunnerOptions(device="cuda", dtype=dtype, kv_tokens=length + 64, max_context=length + 16,
                         max_batch=1, cuda_graphs=False)  # fmt: skip
    runner = ModelRunner(cfg, opts)
    ids = bench_ids(length, cfg.vocab, 11)
    ours = runner.prefill(11, ids)
    model = hf_model(cfg, runner)
    with torch.inference_mode():
        ref = model(torch.tensor([ids], device="cuda")).logits[0, -1].float()
    err = float((ours - ref).abs().max())
    top = int(ours.argmax())
    return {
        "shape": shape,
        "dtype": dtype,
        "prompt_len": length,
        "max_abs_err": err,
        "max_rel_err": err / float(ref.abs().max()),
        "greedy_ours": top,
        "greedy_hf": int(ref.argmax()),
        "same_token": top == int(ref.argmax()),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers  # noqa: PLC0415

    report: dict[str, Any] = {"transformers": transformers.__version__, "checks": [], "errors": []}
    for shape, dtype, length in [
        ("tiny-llama", "float32", 300), ("tiny-qwen3", "float32", 300),
        ("llama-3.2-1b", "bfloat16", 1024), ("qwen3-0.6b", "bfloat16", 1024),
        ("llama-3.1-8b", "bfloat16", 1024),
    ]:  # fmt: skip
        try:
            report["checks"].append(check(shape, dtype, length))
        except Exception as exc:  # one shape failing must not hide the others
            traceback.print_exc()
            report["errors"].append({"shape": shape, "error": repr(exc)[-800:]})
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
