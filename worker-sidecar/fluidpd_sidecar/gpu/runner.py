"""The model runner: prefill, extend and batched decode over the paged cache.

``prefill(rid, ids, start)`` computes positions [start, start+len(ids)) of one request on top
of whatever KV it already holds (start = 0: a prompt or a prefix; start = p: the extend of a
stolen suffix on imported KV) and returns the last position's logits. ``step(rids, last)``
runs one token for each request in the batch and leaves its logits (``logits(n)``, fp32) and
their argmax (``greedy(n)``) in static buffers; ``decode`` is the two together. On CUDA the
decode step replays a CUDA graph captured per batch-size bucket (``capture``); every input
lives in static buffers, and the attention kernel reads lengths and page tables from them, so
one graph serves any lengths. The graph computes the argmax itself, so an all-greedy batch
(the common case) costs one small copy to the host and no sampling kernels.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from fluidpd_sidecar.gpu.attention import HAVE_TRITON, decode_attention, prefill_attention
from fluidpd_sidecar.gpu.checkpoint import load_weights
from fluidpd_sidecar.gpu.config import ModelConfig
from fluidpd_sidecar.gpu.kvcache import SCRATCH_PAGE, PagedKVCache
from fluidpd_sidecar.gpu.model import (
    Weights,
    attn_out_and_mlp,
    final_logits,
    head_logits,
    qkv_projection,
    rope_tables,
    seeded_weights,
)

#: Decode batch sizes with a captured graph; a batch runs in the smallest bucket >= its size.
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


@dataclass(slots=True)
class RunnerOptions:
    device: str = "cuda"
    dtype: str = "bfloat16"
    seed: int = 0
    #: A Hugging Face model directory to load the weights from (None: seeded weights).
    model_dir: str | None = None
    kv_tokens: int = 65536
    page_size: int = 16
    max_context: int = 16384
    max_batch: int = 256
    cuda_graphs: bool = True
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    #: The only ids the model may output (None: its whole vocabulary). Seeded weights are run
    #: with the served tokenizer's text ids: random logits pick any of the 128K ids of a real
    #: shape, and an id the (1,024-id embedded) tokenizer cannot render streams no text.
    output_ids: tuple[int, ...] | None = None


@dataclass(slots=True)
class GraphStats:
    captured: bool = False
    capture_s: float = 0.0
    buckets: list[int] = field(default_factory=list)


class ModelRunner:
    def __init__(self, cfg: ModelConfig, opts: RunnerOptions) -> None:
        self.cfg = cfg
        self.opts = opts
        self.device = torch.device(opts.device)
        self.dtype = getattr(torch, opts.dtype)
        t0 = time.perf_counter()
        if opts.model_dir:
            self.weights: Weights = load_weights(opts.model_dir, cfg, self.device, self.dtype)
            if self.device.type == "cuda":  # the loader's unfused pieces (workers share a GPU)
                torch.cuda.empty_cache()
        else:
            self.weights = seeded_weights(cfg, opts.seed, self.device, self.dtype)
        self.cache = PagedKVCache(cfg, opts.kv_tokens, opts.page_size, self.device, self.dtype)
        self.cos, self.sin = rope_tables(cfg, opts.max_context + 1, self.device, self.dtype)
        self.on_cuda = self.device.type == "cuda"
        # FLUIDPD_NO_TRITON=1 forces the reference decode attention (a fallback, and a check).
        self.use_triton = (
            self.on_cuda and HAVE_TRITON and os.environ.get("FLUIDPD_NO_TRITON") != "1"
        )
        self.max_pages = -(-opts.max_context // opts.page_size)
        self.buckets = sorted(b for b in opts.buckets if b <= opts.max_batch) or [opts.max_batch]
        if self.buckets[-1] < opts.max_batch:
            self.buckets.append(opts.max_batch)
        n = self.buckets[-1]
        dev = self.device
        self._ids = torch.zeros(n, dtype=torch.long, device=dev)
        self._pos = torch.zeros(n, dtype=torch.long, device=dev)
        self._slots = torch.zeros(n, dtype=torch.long, device=dev)
        self._table = torch.zeros(n, self.max_pages, dtype=torch.int32, device=dev)
        self._lens = torch.ones(n, dtype=torch.int32, device=dev)
        self._out = torch.zeros(n, dtype=torch.long, device=dev)
        self._logits = torch.zeros(n, cfg.vocab, dtype=torch.float32, device=dev)
        #: True for the ids the model may not output (``opts.output_ids``); None: all allowed.
        self._banned = _banned_ids(cfg.vocab, opts.output_ids, dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_stats = GraphStats()
        self.load_s = time.perf_counter() - t0

    # -- prefill / extend -----------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, rid: int, ids: list[int], start: int = 0) -> torch.Tensor:
        """Positions [start, start+n) of ``rid``; its KV for [0, start) must be in the cache.

        Returns the last position's logits (fp32, ``[vocab]``).
        """
        cfg, cache = self.cfg, self.cache
        n = len(ids)
        stop = start + n
        if stop > self.opts.max_context:
            raise ValueError(f"request {rid}: {stop} positions exceed {self.opts.max_context}")
        cache.ensure(rid, stop)
        dev = self.device
        slots = cache.slots(rid, start, stop).to(dev)
        tok = torch.tensor(ids, dtype=torch.long, device=dev)
        x = self.weights.embed[tok]
        cos, sin = self.cos[start:stop], self.sin[start:stop]
        flat = cache.kv.view(cfg.layers, 2, -1, cfg.kv_heads, cfg.head_dim)
        # One host-to-device copy per call, not per layer (each one is a sync point).
        pages = cache.pages(rid, start) if start else None
        for i, lw in enumerate(self.weights.layers):
            _, q, k, v = qkv_projection(cfg, lw, x, cos, sin)
            flat[i, 0].index_copy_(0, slots, k)
            flat[i, 1].index_copy_(0, slots, v)
            if pages is None:
                kk, vv = k, v
            else:
                kp, vp = cache.gather(i, pages, start)
                kk, vv = torch.cat([kp, k]), torch.cat([vp, v])
            x = attn_out_and_mlp(cfg, lw, x, prefill_attention(q, kk, vv))
        logits = final_logits(cfg, self.weights, x[-1:])[0]
        return logits if self._banned is None else logits.masked_fill(self._banned, -math.inf)

    # -- decode ----------------------------------------------------------------------------------
    def _decode_body(self, n: int) -> None:
        cfg, cache = self.cfg, self.cache
        ids, pos, slots = self._ids[:n], self._pos[:n], self._slots[:n]
        table, lens = self._table[:n], self._lens[:n]
        x = self.weights.embed[ids]
        cos, sin = self.cos[pos], self.sin[pos]
        flat = cache.kv.view(cfg.layers, 2, -1, cfg.kv_heads, cfg.head_dim)
        for i, lw in enumerate(self.weights.layers):
            _, q, k, v = qkv_projection(cfg, lw, x, cos, sin)
            flat[i, 0].index_copy_(0, slots, k)
            flat[i, 1].index_copy_(0, slots, v)
            kp, vp = cache.layer(i)
            attn = decode_attention(q, kp, vp, table, lens, self.use_triton)
            x = attn_out_and_mlp(cfg, lw, x, attn)
        logits = self._logits[:n]
        logits.copy_(head_logits(cfg, self.weights, x))  # to fp32 in the copy
        if self._banned is not None:  # every reader (argmax, sampler, logprobs) sees the mask
            logits.masked_fill_(self._banned, -math.inf)
        self._out[:n] = logits.argmax(-1)

    def _bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"decode batch {n} exceeds max_batch {self.buckets[-1]}")

    def decode(self, rids: list[int], last: list[int]) -> list[int]:
        """One greedy token for each request (``last``: its latest token)."""
        self.step(rids, last)
        return self.greedy(len(rids))

    def greedy(self, n: int) -> list[int]:
        """The argmax tokens of the last step's first ``n`` rows."""
        return [int(t) for t in self._out[:n].tolist()] if n else []

    def logits(self, n: int) -> torch.Tensor:
        """The last step's logits ``[n, vocab]`` fp32 (a view: valid until the next step)."""
        return self._logits[:n]

    @torch.inference_mode()
    def step(self, rids: list[int], last: list[int]) -> None:
        """One decode position for each request (``last``: its latest token)."""
        n = len(rids)
        if n == 0:
            return
        cache = self.cache
        b = self._bucket(n) if self._graphs else n
        page = cache.page_size
        # Host-side inputs are built in numpy (per-request torch tensors cost ~10 us each).
        table = np.full((b, self.max_pages), SCRATCH_PAGE, dtype=np.int32)
        pos = np.zeros(b, dtype=np.int64)
        slots = np.zeros(b, dtype=np.int64)
        lens = np.ones(b, dtype=np.int32)
        ids = np.zeros(b, dtype=np.int64)
        ids[:n] = last
        for j, rid in enumerate(rids):
            p = cache.lengths[rid]
            cache.ensure(rid, p + 1)
            pages = cache.tables[rid]
            table[j, : len(pages)] = pages
            pos[j] = p
            slots[j] = pages[p // page] * page + p % page
            lens[j] = p + 1
        self._ids[:b].copy_(torch.from_numpy(ids), non_blocking=self.on_cuda)
        self._pos[:b].copy_(torch.from_numpy(pos), non_blocking=self.on_cuda)
        self._slots[:b].copy_(torch.from_numpy(slots), non_blocking=self.on_cuda)
        self._table[:b].copy_(torch.from_numpy(table), non_blocking=self.on_cuda)
        self._lens[:b].copy_(torch.from_numpy(lens), non_blocking=self.on_cuda)
        graph = self._graphs.get(b)
        if graph is not None:
            graph.replay()
        else:
            self._decode_body(b)

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture one decode graph per bucket (once; kept across role switches). Not with the
        reference decode attention (FLUIDPD_NO_TRITON=1): it reads lengths on the host, which
        a graph cannot; decode then runs eagerly."""
        if not self.on_cuda or not self.opts.cuda_graphs or self._graphs or not self.use_triton:
            return 0.0
        t0 = time.perf_counter()
        self._table.fill_(SCRATCH_PAGE)
        self._lens.fill_(1)
        self._slots.zero_()
        self._pos.zero_()
        self._ids.zero_()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._decode_body(self.buckets[-1])
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self._decode_body(b)
            self._graphs[b] = g
        torch.cuda.synchronize()
        self.graph_stats = GraphStats(True, time.perf_counter() - t0, list(self.buckets))
        return self.graph_stats.capture_s

    # -- hand-off -------------------------------------------------------------------------------
    def export(self, rid: int, tokens: int) -> torch.Tensor:
        return self.cache.export(rid, tokens)

    def load(self, rid: int, data: torch.Tensor) -> None:
        self.cache.load(rid, data)

    def release(self, rid: int) -> None:
        self.cache.free(rid)

    def sync(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()


def _banned_ids(
    vocab: int, allowed: tuple[int, ...] | None, device: torch.device
) -> torch.Tensor | None:
    if allowed is None:
        return None
    inside = [i for i in allowed if 0 <= i < vocab]
    if not inside:
        raise ValueError(f"output_ids: none of them inside the model's {vocab} ids")
    banned = torch.ones(vocab, dtype=torch.bool)
    banned[inside] = False
    return banned.to(device)


def pin_host_memory(base: int, nbytes: int) -> bool:
    """Page-lock an existing host buffer (a transport arena) for DMA; True on success."""
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    return int(cudart.cudaHostRegister(base, nbytes, 0)) == 0
