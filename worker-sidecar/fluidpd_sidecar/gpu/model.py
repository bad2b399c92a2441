"""The transformer: weights (seeded here; a model directory's in ``checkpoint``) and the forward
pass over the paged cache.

Weights are stored fused the way serving engines keep them (q|k|v in one matrix, gate|up in
another) so that a step launches few GEMMs. Seeded weights are drawn layer by layer from one
``torch.Generator`` seeded with ``seed`` on the target device, so every process on the same
kind of device gets bit-identical weights without any download. The LM head is drawn with a
larger spread than an untrained init so that logits have a clear maximum (random weights give
near-uniform logits, where bf16 noise alone would flip the greedy token); norms are ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the universal torch spelling

from fluidpd_sidecar.gpu.config import ModelConfig


@dataclass(slots=True)
class LayerWeights:
    ln1: torch.Tensor
    wqkv: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: torch.Tensor
    ln2: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


@dataclass(slots=True)
class Weights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        out = [self.embed, self.norm, self.lm_head]
        for lw in self.layers:
            out += [lw.ln1, lw.wqkv, lw.wo, lw.ln2, lw.w_gate_up, lw.w_down]
            out += [t for t in (lw.q_norm, lw.k_norm) if t is not None]
        return out

    def pointers(self) -> list[int]:
        """Storage addresses: the in-place role switch must leave them unchanged."""
        return [t.data_ptr() for t in self.tensors()]

    def nbytes(self) -> int:
        seen = {t.data_ptr(): t.numel() * t.element_size() for t in self.tensors()}
        return sum(seen.values())


def seeded_weights(
    cfg: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype
) -> Weights:
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        t = torch.empty(rows, cols, device=device, dtype=dtype)
        return t.normal_(0.0, std, generator=g)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    h, d = cfg.hidden, cfg.head_dim
    q, kv = cfg.heads * d, cfg.kv_heads * d
    embed = normal(cfg.vocab, h, 1.0)
    layers = []
    for _ in range(cfg.layers):
        layers.append(
            LayerWeights(
                ln1=ones(h),
                wqkv=normal(q + 2 * kv, h, 1.0 / math.sqrt(h)),
                q_norm=ones(d) if cfg.qk_norm else None,
                k_norm=ones(d) if cfg.qk_norm else None,
                wo=normal(h, q, 1.0 / math.sqrt(q * cfg.layers)),
                ln2=ones(h),
                w_gate_up=normal(2 * cfg.intermediate, h, 1.0 / math.sqrt(h)),
                w_down=normal(h, cfg.intermediate, 1.0 / math.sqrt(cfg.intermediate * cfg.layers)),
            )
        )
    lm_head = embed if cfg.tie_embeddings else normal(cfg.vocab, h, 4.0 / math.sqrt(h))
    return Weights(embed, layers, ones(h), lm_head)


def rope_tables(
    cfg: ModelConfig, max_pos: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``[max_pos, head_dim]`` for Hugging Face's rotate-half layout.

    The sin table carries rotate-half's sign (its first half negated), so that applying the
    rotation is ``x * cos + roll(x, d/2) * sin``: three kernels instead of six.
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling
    if rs is not None:  # Llama-3 scaling, as transformers' _compute_llama3_parameters
        low_wl = rs.original_max_position / rs.low_freq_factor
        high_wl = rs.original_max_position / rs.high_freq_factor
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > low_wl, inv / rs.factor, inv)
        smooth = (rs.original_max_position / wl - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor
        )
        mid = (1 - smooth) * scaled / rs.factor + smooth * scaled
        inv = torch.where((wl >= high_wl) & (wl <= low_wl), mid, scaled)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
    return emb.cos().to(device, dtype), sin.to(device, dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def qkv_projection(
    cfg: ModelConfig,
    lw: LayerWeights,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns the residual stream's norm input and q ``[T,H,d]``, k, v ``[T,Hkv,d]``."""
    h = F.rms_norm(x, (cfg.hidden,), lw.ln1, cfg.rms_eps)
    qkv = F.linear(h, lw.wqkv)
    d = cfg.head_dim
    q_n, kv_n = cfg.heads * d, cfg.kv_heads * d
    v = qkv[:, q_n + kv_n :].view(-1, cfg.kv_heads, d)
    c, s = cos[:, None, :], sin[:, None, :]
    if lw.q_norm is not None and lw.k_norm is not None:
        q = F.rms_norm(qkv[:, :q_n].view(-1, cfg.heads, d), (d,), lw.q_norm, cfg.rms_eps)
        k = F.rms_norm(
            qkv[:, q_n : q_n + kv_n].view(-1, cfg.kv_heads, d), (d,), lw.k_norm, cfg.rms_eps
        )
        return h, _rotate(q, c, s), _rotate(k, c, s), v
    # q and k rotated together: one set of kernels for both (eager prefill is launch-bound
    # for short prompts, so every kernel per layer counts).
    qk = _rotate(qkv[:, : q_n + kv_n].view(-1, cfg.heads + cfg.kv_heads, d), c, s)
    return h, qk[:, : cfg.heads], qk[:, cfg.heads :], v


def attn_out_and_mlp(
    cfg: ModelConfig, lw: LayerWeights, x: torch.Tensor, attn: torch.Tensor
) -> torch.Tensor:
    x = torch.addmm(x, attn.reshape(attn.shape[0], -1), lw.wo.t())
    h = F.rms_norm(x, (cfg.hidden,), lw.ln2, cfg.rms_eps)
    gate, up = F.linear(h, lw.w_gate_up).chunk(2, dim=-1)
    return torch.addmm(x, F.silu(gate) * up, lw.w_down.t())


def head_logits(cfg: ModelConfig, w: Weights, x: torch.Tensor) -> torch.Tensor:
    """The LM head's logits in the model's dtype."""
    return F.linear(F.rms_norm(x, (cfg.hidden,), w.norm, cfg.rms_eps), w.lm_head)


def final_logits(cfg: ModelConfig, w: Weights, x: torch.Tensor) -> torch.Tensor:
    """The LM head's logits in fp32 (what sampling reads)."""
    return head_logits(cfg, w, x).float()
