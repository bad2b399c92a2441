"""``rotary_embedding``: the in-place rotary kernel SGLang's CPU path falls back to.

SGLang 0.5.17's ``RotaryEmbedding`` imports ``vllm._custom_ops.rotary_embedding`` when it runs
neither on CUDA nor with its (unbuilt here) CPU engine. This is the same rotation in torch, in
place like the kernel: ``cos_sin_cache[pos] = [cos | sin]`` over ``rotary_dim``, neox style
rotating the two halves, GPT-J style the even/odd pairs.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    positions = positions.flatten()
    n = positions.shape[0]
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for t in (query, key):
        if t is None:
            continue
        v = t.view(n, -1, head_size)
        v[..., :rot] = _rotate(v[..., :rot], cos, sin, is_neox)
