"""The KV hand-off wire format of the ``gpu`` engine.

A fixed 256-byte header, then K and V of every layer for the prefix positions
(``[layers, 2, tokens, kv_heads, head_dim]``, the engine's dtype). The header starts with
``kv_stamp(rid)``, so the sidecar's existing check that the right request's bytes arrived
holds for real KV too, and carries the first output token when the prefill side computed the
whole prompt (SGLang sends it the same way, beside the KV): the decode side can then stream
it at once without a forward pass.

A buffer is host memory (``memoryview``, the ``shm`` and ``mooncake`` arenas) or device memory
(``DeviceView``, the ``cuda-ipc`` arena): the KV is then copied on the GPU, never through the
host, and only the header crosses (256 bytes each way).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from fluidpd_sidecar.device_view import DeviceView
from fluidpd_sidecar.engine import KVBytes, kv_stamp
from fluidpd_sidecar.gpu.config import ModelConfig

HEADER = 256
_FMT = "<8sqqqqqq"  # stamp, tokens, first token (-1: none), layers, kv_heads, head_dim, elsize
_FMT_SIZE = struct.calcsize(_FMT)


@dataclass(frozen=True, slots=True)
class WireHeader:
    rid: int
    tokens: int
    first_token: int
    layers: int
    kv_heads: int
    head_dim: int
    element_size: int


def wire_bytes(cfg: ModelConfig, tokens: int, element_size: int = 2) -> int:
    return HEADER + tokens * cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * element_size


def write(view: KVBytes, rid: int, first_token: int, kv: torch.Tensor) -> int:
    """Fills ``view`` with the header and ``kv`` (``[L, 2, tokens, kvh, d]``); bytes written.

    A host ``view`` should be pinned memory when ``kv`` is on a GPU (the copy is then a DMA).
    A device ``view`` is complete when this returns: a peer process reads it next, and it
    cannot wait on this process's stream.
    """
    layers, _, tokens, kvh, d = kv.shape
    esize = kv.element_size()
    head = struct.pack(_FMT, kv_stamp(rid), tokens, first_token, layers, kvh, d, esize)
    n = kv.numel() * esize
    if len(view) < HEADER + n:
        raise ValueError(f"{HEADER + n} B of KV do not fit a {len(view)} B buffer")
    if isinstance(view, DeviceView):
        view[: len(head)] = head
        if n:
            view.tensor[HEADER : HEADER + n].view(kv.dtype).view(kv.shape).copy_(kv)
        if view.tensor.is_cuda:
            torch.cuda.current_stream(view.tensor.device).synchronize()
        return HEADER + n
    view[: len(head)] = head
    if n:
        host = torch.frombuffer(view, dtype=torch.uint8, count=n, offset=HEADER)
        host.view(kv.dtype).view(kv.shape).copy_(kv)
    return HEADER + n


def read_header(view: KVBytes) -> WireHeader:
    raw = bytes(view[:_FMT_SIZE]) if isinstance(view, DeviceView) else view
    stamp, tokens, first, layers, kvh, d, esize = struct.unpack_from(_FMT, raw)
    return WireHeader(int.from_bytes(stamp, "little"), tokens, first, layers, kvh, d, esize)


def payload(view: KVBytes, head: WireHeader, dtype: torch.dtype) -> torch.Tensor:
    """The KV block of a received buffer, as a tensor over the buffer (no copy)."""
    n = head.layers * 2 * head.tokens * head.kv_heads * head.head_dim * head.element_size
    shape = (head.layers, 2, head.tokens, head.kv_heads, head.head_dim)
    if n == 0:
        return torch.empty(*shape, dtype=dtype)
    if len(view) < HEADER + n:
        raise ValueError(f"a header announcing {HEADER + n} B in a {len(view)} B buffer")
    if isinstance(view, DeviceView):
        return view.tensor[HEADER : HEADER + n].view(dtype).view(shape)
    raw = torch.frombuffer(view, dtype=torch.uint8, count=n, offset=HEADER)
    return raw.view(dtype).view(shape)
