"""Step-time measurements on the gpu engine, for ``fluidpd profile`` and the H200 benchmarks.

Every timing is wall time around the engine's own code path with a device sync at both ends
(what the scheduler waits for): ``ModelRunner.prefill`` for prompts and for suffix extends on
a resident prefix, ``ModelRunner.decode`` (CUDA-graph replay on the GPU) for decode steps,
and the wire staging + shm copy + load for hand-offs. Each point is the median of at least
``repeat`` runs after one warm-up, repeated (like ``timeit``'s autorange) until ``min_time_s``
of runs have passed: a launch-bound small shape takes a few milliseconds and a median of three
of those moved by tens of percent with the host's noise. Decode points use requests whose cache
pages are allocated but not filled (a step's time does not depend on the values in the cache),
reset to the same context before every run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fluidpd_sidecar.gpu import wire
from fluidpd_sidecar.gpu.runner import ModelRunner, pin_host_memory
from fluidpd_sidecar.transfer import KVDest
from fluidpd_sidecar.transfer_shm import ShmTransfer


@dataclass(slots=True)
class Grid:
    prefill: list[int] = field(default_factory=lambda: [128, 256, 512, 1024, 2048, 4096, 8192])
    suffix: list[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048])
    # A suffix's extend attends over its prefix (``SuffixPredictor.sp``): timed at long
    # contexts too, so that sp is measured there rather than extrapolated from 2K tokens.
    suffix_prefix: list[int] = field(default_factory=lambda: [512, 2048, 8192])
    decode_batch: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32, 64, 128])
    decode_context: list[int] = field(default_factory=lambda: [256, 1024, 2048, 4096])
    transfer_tokens: list[int] = field(default_factory=lambda: [64, 256, 1024, 4096])
    repeat: int = 5
    min_time_s: float = 0.25
    max_repeat: int = 400


def quick_grid() -> Grid:
    """A small grid for CPU checks and CI."""
    return Grid([16, 32, 64, 96, 128], [8, 16, 32, 64], [32], [1, 2, 4, 8], [32, 64, 128],
                [16, 64], 2, 0.0)  # fmt: skip


def bench_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    """``n`` token ids drawn uniformly from a seeded generator: the prompts of measurements
    (a step's time does not depend on which ids it computes). Never used to serve."""
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, vocab, (n,), generator=g).tolist()]


def _timed(runner: ModelRunner, fn: Callable[[], Any], grid: Grid) -> float:
    fn()
    runner.sync()
    times: list[float] = []
    while len(times) < grid.max_repeat and (
        len(times) < grid.repeat or sum(times) < grid.min_time_s
    ):
        t0 = time.perf_counter()
        fn()
        runner.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_prefill(runner: ModelRunner, grid: Grid, rid: int = 1) -> list[dict[str, float]]:
    rows = []
    for n in grid.prefill:
        if n > runner.opts.max_context:
            continue
        ids = bench_ids(n, runner.cfg.vocab, rid)

        def once(ids: list[int] = ids) -> None:
            runner.prefill(rid, ids)
            runner.release(rid)

        rows.append({"tokens": n, "s": _timed(runner, once, grid)})
    return rows


def measure_suffix(runner: ModelRunner, grid: Grid, rid: int = 2) -> list[dict[str, float]]:
    rows = []
    for p in grid.suffix_prefix:
        for x in grid.suffix:
            if p + x > runner.opts.max_context:
                continue
            ids = bench_ids(p + x, runner.cfg.vocab, rid)
            runner.prefill(rid, ids[:p])

            def once(p: int = p, ids: list[int] = ids) -> None:
                runner.prefill(rid, ids[p:], start=p)
                runner.cache.lengths[rid] = p  # the next repeat extends the same prefix

            rows.append({"prefix": p, "tokens": x, "s": _timed(runner, once, grid)})
            runner.release(rid)
    return rows


def measure_decode(runner: ModelRunner, grid: Grid, base_rid: int = 1000) -> list[dict[str, float]]:
    rows = []
    cache = runner.cache
    for n in grid.decode_batch:
        if n > runner.buckets[-1]:
            continue
        for c in grid.decode_context:
            if c + 2 > runner.opts.max_context:
                continue
            if n * (c + 1 + cache.page_size) > cache.capacity_tokens:
                continue
            rids = list(range(base_rid, base_rid + n))
            for r in rids:
                cache.ensure(r, c)
            last = [1] * n

            def once(rids: list[int] = rids, last: list[int] = last, c: int = c) -> None:
                for r in rids:
                    cache.lengths[r] = c  # every run is a step at the same context
                runner.decode(rids, last)

            s = _timed(runner, once, grid)
            rows.append({"batch": n, "context_per_request": c, "context": n * (c + 2), "s": s})
            for r in rids:
                runner.release(r)
    return rows


def measure_transfer(runner: ModelRunner, grid: Grid, rid: int = 3) -> list[dict[str, float]]:
    """Hand-off of a prefix: stage into a pinned arena, copy to a peer arena, load on device."""
    cfg = runner.cfg
    esize = runner.weights.embed.element_size()
    biggest = max(grid.transfer_tokens)
    size = wire.wire_bytes(cfg, biggest, esize) + 4096
    src, dst = ShmTransfer(size), ShmTransfer(size)
    if runner.on_cuda:
        for t in (src, dst):
            pin_host_memory(t.base, t.arena_bytes)
    rows = []
    for n in grid.transfer_tokens:
        if n > runner.opts.max_context:
            continue
        runner.cache.ensure(rid, n)
        nbytes = wire.wire_bytes(cfg, n, esize)
        region = src.source_buffer(nbytes)
        dest = dst.reserve(nbytes)
        assert region is not None and dest is not None
        parts: dict[str, list[float]] = {"stage": [], "copy": [], "load": []}

        def once(
            parts: dict[str, list[float]] = parts,
            region: Any = region,
            dest: KVDest = dest,
            n: int = n,
            nbytes: int = nbytes,
        ) -> None:
            t0 = time.perf_counter()
            wire.write(src.view(region.addr, nbytes), rid, -1, runner.export(rid, n))
            runner.sync()
            t1 = time.perf_counter()
            src.write(region.addr, dest, nbytes)
            t2 = time.perf_counter()
            view = dst.view(dest.addr, nbytes)
            runner.load(rid + 1, wire.payload(view, wire.read_header(view), runner.dtype))
            runner.sync()
            runner.release(rid + 1)
            parts["stage"].append(t1 - t0)
            parts["copy"].append(t2 - t1)
            parts["load"].append(time.perf_counter() - t2)

        s = _timed(runner, once, grid)
        med = {k: statistics.median(v) for k, v in parts.items()}
        rows.append({"tokens": n, "bytes": nbytes, "s": s, **{f"{k}_s": v for k, v in med.items()}})
        src.release_source(region)
        dst.free(dest)
        runner.release(rid)
    src.close()
    dst.close()
    return rows


def prefill_flops(runner: ModelRunner, tokens: int) -> float:
    """FLOPs of a prefill: 2 x linear params x tokens, causal attention, LM head on the last."""
    cfg = runner.cfg
    linear = cfg.params()["layer_linear"]
    attn = 4 * cfg.layers * cfg.heads * cfg.head_dim * tokens * (tokens + 1) / 2
    return 2.0 * linear * tokens + attn + 2.0 * cfg.vocab * cfg.hidden
