"""A Hugging Face model directory as the gpu engine loads it: the shape from ``config.json``,
the weights from ``*.safetensors`` (one file, or shards listed by ``model.safetensors.index.json``).

Tensors are read one at a time with ``safe_open`` onto the target device (no full copy of the
checkpoint in host memory: four 8B workers share one host), converted to the engine's dtype and
fused the way ``model.Weights`` keeps them. Every name and shape is checked against
``config.json`` before a byte is read, so a checkpoint that does not match its config, a
missing shard or a corrupt file is one ``ModelDirError`` line naming the file and the tensor,
not a shape error deep in the first forward pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fluidpd.modeldir.model_dir import ModelDirError
from fluidpd.modeldir.weights import INDEX, index_weight_map, weight_files
from fluidpd_sidecar.gpu.config import ModelConfig, from_hf_config
from fluidpd_sidecar.gpu.model import LayerWeights, Weights


def model_dir_config(model_dir: str | Path) -> ModelConfig:
    """The shape of the model in ``model_dir`` (named after the directory)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelDirError(f"{root}: not a directory")
    config = root / "config.json"
    if not config.is_file():
        raise ModelDirError(f"{config}: missing (a model directory needs its config.json)")
    return from_hf_config(config, name=root.resolve().name)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama / Qwen3 checkpoint of this shape holds, Hugging Face names."""
    h, d, inter = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, kv = cfg.heads * d, cfg.kv_heads * d
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab, h)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
    return out


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    """Tensors a valid checkpoint may carry that the engine does not use."""
    if name.endswith("rotary_emb.inv_freq"):  # a buffer older transformers saved
        return True
    return cfg.tie_embeddings and name == "lm_head.weight"  # tied: the embedding is the head


def _open(path: Path, device: torch.device) -> Any:
    from safetensors import safe_open  # noqa: PLC0415 - the loader's optional dependency

    try:
        return safe_open(str(path), framework="pt", device=str(device))
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # SafetensorError: a truncated or foreign file
        raise ModelDirError(f"{path}: not a valid safetensors file: {exc}") from None


def _tensor_files(root: Path) -> dict[str, Path]:
    """Which file holds each tensor: the index's weight map, or the single file's keys."""
    where = index_weight_map(root)
    if where is not None:
        return where
    where = {}
    for f in weight_files(root):
        for name in _open(f, torch.device("cpu")).keys():  # noqa: SIM118 - not a dict
            where[str(name)] = f
    return where


def load_weights(
    model_dir: str | Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype
) -> Weights:
    """The checkpoint in ``model_dir`` as fused ``Weights`` on ``device`` in ``dtype``."""
    root = Path(model_dir)
    where = _tensor_files(root)
    want = expected_shapes(cfg)
    for name in want:
        if name not in where:
            raise ModelDirError(f"{root}: tensor {name} is in no safetensors file")
    for name, path in where.items():
        if name not in want and not _ignorable(name, cfg):
            raise ModelDirError(
                f"{path}: unexpected tensor {name} (config.json: {cfg.layers} layers, "
                f"{'Qwen3' if cfg.qk_norm else 'Llama'})"
            )
    handles: dict[Path, Any] = {}
    for path in sorted({where[n] for n in want}):
        if not path.is_file():
            raise ModelDirError(f"{path}: missing (named by {INDEX})")
        handles[path] = _open(path, device)
    for name, shape in want.items():
        path = where[name]
        try:
            got = tuple(handles[path].get_slice(name).get_shape())
        except Exception as exc:  # the index names a tensor the file lacks
            raise ModelDirError(f"{path}: tensor {name}: {exc}") from None
        if got != shape:
            raise ModelDirError(
                f"{path}: tensor {name} has shape {list(got)}, config.json implies {list(shape)}"
            )

    def get(name: str) -> torch.Tensor:
        path = where[name]
        try:
            t: torch.Tensor = handles[path].get_tensor(name)
        except Exception as exc:  # data region truncated or unreadable
            raise ModelDirError(f"{path}: tensor {name} cannot be read: {exc}") from None
        return t.to(device=device, dtype=dtype)

    layers = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(
            LayerWeights(
                ln1=get(p + "input_layernorm.weight"),
                wqkv=torch.cat([get(a + f"{x}_proj.weight") for x in "qkv"]),
                q_norm=get(a + "q_norm.weight") if cfg.qk_norm else None,
                k_norm=get(a + "k_norm.weight") if cfg.qk_norm else None,
                wo=get(a + "o_proj.weight"),
                ln2=get(p + "post_attention_layernorm.weight"),
                w_gate_up=torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]),
                w_down=get(m + "down_proj.weight"),
            )
        )
    embed = get("model.embed_tokens.weight")
    lm_head = embed if cfg.tie_embeddings else get("lm_head.weight")
    return Weights(embed, layers, get("model.norm.weight"), lm_head)
