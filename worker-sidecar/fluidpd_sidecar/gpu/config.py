"""Model shapes: published hyperparameters of Llama-3.1 / Llama-3.2 / Qwen3, and tiny CI twins.

The numbers are copied from each model's released ``config.json`` (sources in
``profiles/README.md``); a local Hugging Face ``config.json`` can be read instead. One
architecture covers both families: RMSNorm, rotary embeddings (Llama-3 frequency scaling where
the config has it), grouped-query attention, SwiGLU MLP; Qwen3 adds a per-head RMSNorm on q and
k (``qk_norm``) and uses an explicit ``head_dim``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fluidpd.modeldir.model_dir import ModelDirError


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3 ``rope_type: llama3`` frequency scaling (long-context extension)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    qk_norm: bool
    tie_embeddings: bool
    max_position: int
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} not a multiple of {self.kv_heads}")

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, bf16 (what a hand-off moves per token)."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def params(self) -> dict[str, int]:
        """Parameter counts: per-layer linear weights, embeddings and LM head."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        layer_linear = attn + mlp
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else embed
        total = self.layers * (layer_linear + norms) + embed + head + self.hidden
        return {"layer_linear": layer_linear * self.layers, "embed": embed, "total": total}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_config(self) -> dict[str, Any]:
        """This shape as ``config.json`` fields (what ``transformers``' ``LlamaConfig`` and
        ``Qwen3Config`` take; ``from_hf_config`` reads them back)."""
        out: dict[str, Any] = {
            "vocab_size": self.vocab, "hidden_size": self.hidden,
            "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_embeddings,
        }  # fmt: skip
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            out["rope_scaling"] = {
                "rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position,
            }  # fmt: skip
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelConfig:
        """The inverse of ``to_json`` (a profile report's ``shape``)."""
        fields = dict(data)
        rs = fields.pop("rope_scaling", None)
        return cls(**fields, rope_scaling=RopeScaling(**rs) if rs else None)


_LLAMA3_SCALING_8B = RopeScaling(8.0, 1.0, 4.0, 8192)
_LLAMA3_SCALING_1B = RopeScaling(32.0, 1.0, 4.0, 8192)

#: Shapes from the published config.json files (sources: profiles/README.md).
SHAPES: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        "llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, 500000.0, 1e-5, False, False,
        131072, _LLAMA3_SCALING_8B,
    ),
    "llama-3.2-1b": ModelConfig(
        "llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, 500000.0, 1e-5, False, True,
        131072, _LLAMA3_SCALING_1B,
    ),
    "qwen3-8b": ModelConfig(
        "qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 1000000.0, 1e-6, True, False, 40960
    ),
    "qwen3-0.6b": ModelConfig(
        "qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, 1000000.0, 1e-6, True, True, 40960
    ),
    # CI twins: the same code paths (GQA, RoPE scaling / qk-norm, tied and untied heads).
    "tiny-llama": ModelConfig(
        "tiny-llama", 64, 2, 4, 2, 16, 128, 512, 500000.0, 1e-5, False, False, 4096,
        RopeScaling(8.0, 1.0, 4.0, 256),
    ),
    "tiny-qwen3": ModelConfig(
        "tiny-qwen3", 64, 2, 4, 2, 32, 96, 512, 1000000.0, 1e-6, True, True, 4096
    ),
}  # fmt: skip


#: Where each shape's hyperparameters were read (the released config.json files).
SHAPE_SOURCES: dict[str, list[str]] = {
    "llama-3.1-8b": ["https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"],
    "llama-3.2-1b": ["https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json"],
    "qwen3-8b": ["https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json"],
    "qwen3-0.6b": ["https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json"],
}


#: The architectures the engine's forward pass implements (``config.json`` ``architectures``).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


def _rope(data: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """rope_theta and Llama-3 scaling from either config layout: transformers >= 5 writes
    ``rope_parameters`` (theta and type inside), older files ``rope_theta`` + ``rope_scaling``."""
    params = data.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # per-layer-type form
        params = params["full_attention"]
    rs: dict[str, Any] = dict(params or data.get("rope_scaling") or {})
    theta = rs.get("rope_theta", data.get("rope_theta", 10000.0))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in (None, "default"):
        return float(theta), None
    if kind != "llama3":
        raise ModelDirError(
            f"{where}: rope_type {kind!r} is not supported by the gpu engine (default, llama3)"
        )
    try:
        scaling = RopeScaling(
            float(rs["factor"]),
            float(rs["low_freq_factor"]),
            float(rs["high_freq_factor"]),
            int(rs["original_max_position_embeddings"]),
        )
    except KeyError as exc:
        raise ModelDirError(f"{where}: llama3 rope parameters lack {exc.args[0]!r}") from None
    return float(theta), scaling


def _unsupported_features(data: dict[str, Any]) -> str | None:
    """A config feature the forward pass does not implement (it would compute another model)."""
    if data.get("hidden_act", "silu") != "silu":
        return f"hidden_act {data['hidden_act']!r} (only silu)"
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if data.get(key):
            return f"{key}: true"
    return None


def from_hf_config(path: str | Path, name: str | None = None) -> ModelConfig:
    """A shape from a Hugging Face ``config.json`` (Llama and Qwen3 architectures only).

    Anything else, a missing field or a feature the forward pass lacks is a ``ModelDirError``
    (the model directory's error type, ``fluidpd.modeldir.model_dir``) whose one line names
    the file.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ModelDirError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{path}: not a JSON object")
    archs = data.get("architectures") or []
    supported = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
    if not supported:
        got = ", ".join(map(str, archs)) or "none given"
        raise ModelDirError(
            f"{path}: architecture {got} is not supported by the gpu engine "
            f"({', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    feature = _unsupported_features(data)
    if feature is not None:
        raise ModelDirError(f"{path}: {feature} is not supported by the gpu engine")
    theta, scaling = _rope(data, str(path))
    try:
        heads = int(data["num_attention_heads"])
        hidden = int(data["hidden_size"])
        return ModelConfig(
            name=name or str(data.get("_name_or_path") or path.parent.name),
            hidden=hidden,
            layers=int(data["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            intermediate=int(data["intermediate_size"]),
            vocab=int(data["vocab_size"]),
            rope_theta=theta,
            rms_eps=float(data.get("rms_norm_eps", 1e-6)),
            qk_norm=supported[0] == "Qwen3ForCausalLM",
            tie_embeddings=bool(data.get("tie_word_embeddings", False)),
            max_position=int(data.get("max_position_embeddings", 4096)),
            rope_scaling=scaling,
        )
    except KeyError as exc:
        raise ModelDirError(f"{path}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ModelDirError(f"{path}: {exc}") from None


def resolve_shape(spec: str) -> ModelConfig:
    """A shape name from ``SHAPES``, a ``config.json`` path, or a directory holding one."""
    if spec in SHAPES:
        return SHAPES[spec]
    p = Path(spec)
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        return from_hf_config(p)
    raise ValueError(
        f"unknown model shape {spec!r}: use one of {', '.join(sorted(SHAPES))} or a config.json"
    )


def with_layers(cfg: ModelConfig, layers: int) -> ModelConfig:
    """The same shape with fewer layers (for quick checks of a large shape)."""
    return replace(cfg, layers=layers, name=f"{cfg.name}-{layers}l")
