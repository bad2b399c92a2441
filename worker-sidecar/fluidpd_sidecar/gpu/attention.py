"""Attention over the paged cache.

Prefill and extend: one request's new queries against its whole (prefix + new) K/V through
``scaled_dot_product_attention``; ``causal_lower_right`` puts the causal diagonal where an
unsplit prefill has it (query i of a suffix starting at position p sees keys 0..p+i), so an
extend on imported KV computes what the unsplit prefill computes. A plain prefill uses
``is_causal`` (FlashAttention on the GPU).

Decode: one query per request against its pages. On CUDA a Triton kernel reads the pages in
place (no gather), with per-request lengths read from device memory, so the same kernel runs
inside a CUDA graph for any mix of lengths; elsewhere (CPU CI) a reference gathers and calls
SDPA. The kernel is checked against the reference on the GPU by ``scripts/gpu/bench.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 - the universal torch spelling
from torch.nn.attention.bias import causal_lower_right

try:  # Triton comes with torch's CUDA wheels; absent or unusable, the reference path serves.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the installation
    HAVE_TRITON = False


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q ``[n, H, d]`` (positions p..p+n-1), k/v ``[p+n, Hkv, d]``; returns ``[n, H, d]``."""
    n, heads, _ = q.shape
    total, kv_heads, _ = k.shape
    group = heads // kv_heads
    qt = q.transpose(0, 1).unsqueeze(0)
    kt = k.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    vt = v.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    if total == n:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(n, total))
    return out.squeeze(0).transpose(0, 1)


def decode_attention_reference(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """q ``[B, H, d]``; pages ``[P, S, Hkv, d]``; returns ``[B, H, d]`` (gather + SDPA)."""
    page = k_pages.shape[1]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        pages = block_table[b, : -(-n // page)].long()
        k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:n]
        v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:n]
        out[b] = prefill_attention(q[b : b + 1], k, v)[0] if n > 1 else _single(q[b], k, v)
    return out


def _single(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    group = q.shape[0] // k.shape[1]
    kk = k.repeat_interleave(group, 1)  # [n, H, d]
    vv = v.repeat_interleave(group, 1)
    w = torch.softmax((q.float()[None] * kk.float()).sum(-1) / math.sqrt(q.shape[-1]), 0)
    return (w[..., None] * vv.float()).sum(0).to(q.dtype)


if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _paged_decode_kernel(  # type: ignore[no-untyped-def]
        Q,
        K,
        V,
        BT,
        LENS,
        O,  # noqa: E741 - Triton kernel argument naming (Q, K, V, O)
        sm_scale,
        stride_qb,
        stride_qh,
        stride_kp,
        stride_ks,
        stride_kh,
        stride_bt,
        stride_ob,
        stride_oh,
        GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        seq_len = tl.load(LENS + b)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        gmask = g < GROUP
        heads = kvh * GROUP + g
        q = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
            mask=gmask[:, None],
            other=0.0,
        )
        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
        for start in range(0, seq_len, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            tmask = t < seq_len
            page = tl.load(BT + b * stride_bt + t // PAGE, mask=tmask, other=0).to(tl.int64)
            off = page * stride_kp + (t % PAGE) * stride_ks + kvh * stride_kh
            k = tl.load(K + off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
            v = tl.load(V + off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
            if IEEE:  # fp32 models: full-precision dots (Triton's default for fp32 is TF32)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
            else:
                s = tl.dot(q, tl.trans(k)) * sm_scale
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            O + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(O.dtype.element_ty),
            mask=gmask[:, None],
        )


def decode_attention_triton(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    block_n: int = 64,
) -> torch.Tensor:
    """The paged decode kernel: grid (batch, kv_heads), online softmax in fp32; fp32 inputs
    get IEEE dots, so an fp32 model computes in fp32 throughout (a reference run's needs)."""
    batch, heads, dim = q.shape
    kv_heads = k_pages.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    assert k_pages.stride() == v_pages.stride() and k_pages.stride(-1) == 1
    _paged_decode_kernel[(batch, kv_heads)](
        q,
        k_pages,
        v_pages,
        block_table,
        seq_lens,
        out,
        1.0 / math.sqrt(dim),
        q.stride(0),
        q.stride(1),
        k_pages.stride(0),
        k_pages.stride(1),
        k_pages.stride(2),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=dim,
        PAGE=k_pages.shape[1],
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        num_warps=4,
        num_stages=2,
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    if use_triton:
        return decode_attention_triton(q, k_pages, v_pages, block_table, seq_lens)
    return decode_attention_reference(q, k_pages, v_pages, block_table, seq_lens)
