"""H200 benchmarks of the gpu engine (issue #5); run by ``scripts/gpu/run1.sh``.

Writes one JSON (``--out``), rewritten after every step so that a later failure keeps the
earlier numbers: the measured bf16 matmul peak, the Triton decode kernel against the SDPA
reference, the 8B-shape decode step (batch 32, 1K context; and other batches) against the
HBM bound, prefill throughput and its share of peak, role-switch times with the weights'
storage pointers before and after, and split-prefill equivalence across two processes over
the shm and mooncake transports.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fluidpd.core.types import Role
from fluidpd_sidecar.gpu.attention import decode_attention_reference, decode_attention_triton
from fluidpd_sidecar.gpu.config import resolve_shape
from fluidpd_sidecar.gpu.engine import GpuEngine
from fluidpd_sidecar.gpu.equivalence import split_check
from fluidpd_sidecar.gpu.profiler import bench_ids, prefill_flops
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

HBM_BYTES_PER_S = 4.8e12
NOMINAL_PEAK = 790e12


def cuda_time(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` by CUDA events (device time, back to back)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def wall_time(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def matmul_peak() -> dict[str, float]:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    s = cuda_time(lambda: a @ b, 10)
    return {"n": n, "s": s, "tflops": 2 * n**3 / s / 1e12}


def triton_check() -> list[dict[str, Any]]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for heads, kvh, d, batch, ctx in [
        (32, 8, 128, 32, 1024),
        (32, 8, 64, 8, 3000),
        (16, 8, 128, 3, 77),
    ]:
        pages, page = 4096, 16
        k = torch.randn(pages, page, kvh, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(pages, page, kvh, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q = torch.randn(batch, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        need = -(-ctx // page)
        table = torch.randperm(pages - 1, device="cuda", generator=g)[: batch * need] + 1
        table = table.view(batch, need).to(torch.int32)
        lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        lens[0] = max(1, ctx // 3)
        ref = decode_attention_reference(q, k, v, table, lens)
        out = decode_attention_triton(q, k, v, table, lens)
        rows.append(
            {"heads": heads, "kv_heads": kvh, "head_dim": d, "batch": batch, "context": ctx,
             "max_abs_err": float((out.float() - ref.float()).abs().max()),
             "ref_max_abs": float(ref.float().abs().max())}
        )  # fmt: skip
    return rows


def engine_bench(shape: str, report: dict[str, Any], save: Callable[[], None]) -> None:
    cfg = resolve_shape(shape)
    opts = RunnerOptions(kv_tokens=300_000, max_context=16384, max_batch=256)
    runner = ModelRunner(cfg, opts)
    engine = GpuEngine(runner, Role.PREFILL)
    r: dict[str, Any] = {
        "shape": cfg.to_json(),
        "weights_gb": runner.weights.nbytes() / 1e9,
        "weights_init_s": runner.load_s,
        "kv_pool_tokens": runner.cache.capacity_tokens,
    }
    report[f"engine_{shape}"] = r
    # Prefill throughput: one request of n tokens, wall time with sync (the engine's path).
    pre = []
    for n in (1024, 2048, 4096, 8192):
        ids = bench_ids(n, cfg.vocab, 1)

        def once(ids: list[int] = ids) -> None:
            runner.prefill(1, ids)
            runner.release(1)

        s = wall_time(once, 5, 2)
        flops = prefill_flops(runner, n)
        pre.append({"tokens": n, "s": s, "tflops": flops / s / 1e12,
                    "pct_of_790": 100 * flops / s / NOMINAL_PEAK})  # fmt: skip
    r["prefill"] = pre
    save()
    # Role switches: in place; the first switch to decode captures the decode graphs.
    before = runner.weights.pointers()
    sw = {"p_to_d_first_s": asyncio.run(engine.switch_role(Role.DECODE))}
    sw["graph_capture_s"] = runner.graph_stats.capture_s
    sw["graph_buckets"] = runner.graph_stats.buckets
    sw["d_to_p_s"] = asyncio.run(engine.switch_role(Role.PREFILL))
    sw["p_to_d_s"] = asyncio.run(engine.switch_role(Role.DECODE))
    sw["weights_pointers_unchanged"] = before == runner.weights.pointers()
    sw["log"] = engine.stats.switches
    r["switch"] = sw
    save()
    # Decode steps against the HBM bound (weights + KV read once per step).
    dec = []
    for batch, ctx in [(32, 1024), (1, 1024), (8, 1024), (64, 1024), (128, 1024), (32, 4096)]:
        rids = list(range(100, 100 + batch))
        for rid in rids:
            runner.cache.ensure(rid, ctx)
        last = [1] * batch

        def step(rids: list[int] = rids, last: list[int] = last, ctx: int = ctx) -> None:
            runner.decode(rids, last)
            for rid in rids:  # keep the context at ctx
                runner.cache.lengths[rid] = ctx

        wall = wall_time(step, 30, 3)
        graph = runner._graphs[runner._bucket(batch)]
        replay = cuda_time(graph.replay, 30, 3)
        kv_bytes = batch * (ctx + 1) * cfg.kv_bytes_per_token
        bound = (runner.weights.nbytes() + kv_bytes) / HBM_BYTES_PER_S
        dec.append({"batch": batch, "context": ctx, "step_wall_s": wall, "graph_replay_s": replay,
                    "hbm_bound_s": bound, "x_bound": wall / bound})  # fmt: skip
        for rid in rids:
            runner.release(rid)
        r["decode"] = dec
        save()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--equiv-len", type=int, default=2048)
    args = ap.parse_args()
    out = Path(args.out)
    report: dict[str, Any] = {
        "argv": sys.argv,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "errors": [],
    }

    def save() -> None:
        out.write_text(json.dumps(report, indent=1) + "\n")

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("matmul_peak", matmul_peak),
        ("triton_check", triton_check),
        ("engine", lambda: engine_bench(args.shape, report, save)),
        ("equivalence_shm", lambda: split_check(args.shape, "cuda", "bfloat16", args.equiv_len)),
        (
            "equivalence_mooncake",
            lambda: split_check(
                args.shape, "cuda", "bfloat16", args.equiv_len, transport="mooncake"
            ),
        ),
    ]
    for name, fn in steps:
        t0 = time.perf_counter()
        try:
            value = fn()
            if value is not None:
                report[name] = value
        except Exception as exc:  # keep going: one failed step must not lose the others
            traceback.print_exc()
            report["errors"].append({"step": name, "error": repr(exc)[-1000:]})
        gc.collect()
        torch.cuda.empty_cache()
        report.setdefault("step_s", {})[name] = time.perf_counter() - t0
        save()
        print(f"== {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
