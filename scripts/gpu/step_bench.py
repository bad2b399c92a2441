"""The gpu engine's two headline step times, for one source tree: the decode step (batch 32 at
1K context per request, CUDA-graph replay plus the host work around it) and a 4K-token prefill;
on the new tree also the same decode step with sampling (temperature, top-p, seed, penalties).

Tree-agnostic on purpose: it uses only ``ModelRunner`` methods that the code before and after
issue 12 both have (``prefill``, ``decode``, ``capture``, the cache), so
``scripts/gpu/real_prompts.sh`` runs it once with the checkout's ``worker-sidecar`` and once
with the pre-change tree on ``PYTHONPATH`` and puts the numbers side by side. Prints one JSON
line (and writes it to ``--out``).

    python scripts/gpu/step_bench.py --label new --out new.json              # H200, 8B shape
    python scripts/gpu/step_bench.py --label new --tiny --out new.json       # CPU, tiny shape
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import fluidpd_sidecar.gpu.runner as runner_mod
from fluidpd_sidecar.gpu.config import resolve_shape


def _timer(cuda: bool) -> Callable[[Callable[[], Any], int, int], float]:
    def wall(fn: Callable[[], Any], iters: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize()
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    return wall


def bench(args: argparse.Namespace) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    cfg = resolve_shape(args.shape)
    batch, ctx, prefill_len = args.batch, args.context, args.prefill
    opts = runner_mod.RunnerOptions(
        device=args.device, dtype=args.dtype, kv_tokens=batch * (ctx + 64) + prefill_len + 64,
        max_context=max(ctx + 64, prefill_len + 16), max_batch=batch, buckets=(batch,),
    )  # fmt: skip
    runner = runner_mod.ModelRunner(cfg, opts)
    runner.capture()
    wall = _timer(cuda)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (prefill_len,), generator=g).tolist()

    def prefill() -> None:
        runner.prefill(1, ids)
        runner.release(1)

    prefill_s = wall(prefill, args.iters_prefill, 2)
    rids = list(range(100, 100 + batch))
    for rid in rids:
        runner.cache.ensure(rid, ctx)
    last = [1] * batch

    def step() -> None:
        runner.decode(rids, last)
        for rid in rids:  # every run is a step at the same context
            runner.cache.lengths[rid] = ctx

    decode_s = wall(step, args.iters_decode, 3)
    report: dict[str, Any] = {
        "label": args.label,
        "runner_module": runner_mod.__file__,
        "shape": cfg.name,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "graphs": bool(getattr(runner, "_graphs", None)),
        "prefill_tokens": prefill_len,
        "prefill_s": prefill_s,
        "decode_batch": batch,
        "decode_context": ctx,
        "decode_step_s": decode_s,
    }
    sampled = _sampled_step(runner, rids, last, ctx, wall, args.iters_decode)
    if sampled is not None:
        report["decode_step_sampled_s"] = sampled
    return report


def _sampled_step(
    runner: Any, rids: list[int], last: list[int], ctx: int, wall: Any, iters: int
) -> float | None:
    """The new engine's sampled decode step: the graph, then the sampler over its logits."""
    try:  # the tree before issue 12 has neither
        from fluidpd.api.sampling import SamplingParams  # noqa: PLC0415
        from fluidpd_sidecar.gpu.sampling import Row, Sampler  # noqa: PLC0415
    except ImportError:
        return None
    params = SamplingParams(
        max_new_tokens=64, temperature=0.8, top_p=0.9, top_k=50, seed=1,
        frequency_penalty=0.1, repetition_penalty=1.1,
    )  # fmt: skip
    sampler = Sampler(runner.cfg.vocab, runner.device, 0)
    for rid in rids:
        sampler.add(rid, [1, 2, 3], params)
    rows = [Row(rid, params, 5) for rid in rids]

    def step() -> None:
        runner.step(rids, last)
        sampler.sample(runner.logits(len(rids)), rows)
        for rid in rids:
            runner.cache.lengths[rid] = ctx

    return float(wall(step, iters, 3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny-llama on the CPU (a dry run)")
    ap.add_argument("--shape", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--iters-decode", type=int, default=50)
    ap.add_argument("--iters-prefill", type=int, default=8)
    args = ap.parse_args(argv)
    tiny = {"shape": "tiny-llama", "device": "cpu", "dtype": "float32"}
    full = {"shape": "llama-3.1-8b", "device": "cuda", "dtype": "bfloat16"}
    for key, value in (tiny if args.tiny else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tiny:
        args.iters_decode, args.iters_prefill = min(args.iters_decode, 5), 2
    report = bench(args)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
