"""Start SGLang workers through FluidPD's supervisor (with our scheduler hook) and measure them.

Measures, per worker: the start time (process start to ``/health``), prefill speed (one prompt,
``max_new_tokens=1``, distinct random ids so the radix cache never hits), decode speed at batch
1 and batch B (``ignore_eos``, fixed output length), the decode step period the hook saw, and
the hook's observables mid-run; then both workers decoding at once. Everything goes to
``OUT/sglang_bench.json`` with the command line; server logs beside it.

usage (H200, from scripts/gpu/sglang_run.sh):
  python3 scripts/gpu/sglang_bench.py --out $OUT --shape llama-3.1-8b --workers 2 \
      --mem-fraction 0.35
CPU smoke test (tiny model directory):
  python scripts/gpu/sglang_bench.py --out /tmp/b --device cpu --model-dir DIR --workers 1 \
      --python ~/.cache/fluidpd/sglang-venv/bin/python --prompt-lens 64 --decode-batches 1,4 \
      --new-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports, server_command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import (
    add_stack_args,
    generate,
    model_dir,
    vocab_size,
)
from sglang_stack import random_ids as prompt


async def hook(client: httpx.AsyncClient, port: int) -> dict[str, Any]:
    r = await client.get(f"http://127.0.0.1:{port}/")
    return dict(r.json())


def step_period(steps: list[dict[str, Any]], bs: int) -> float | None:
    """Median spacing of consecutive decode steps at batch size ``bs`` (the step period)."""
    ts = [s["t"] for s in steps if s["kind"] == "decode" and s["bs"] == bs]
    gaps = [b - a for a, b in itertools.pairwise(ts) if b - a < 1.0]
    return statistics.median(gaps) if gaps else None


async def bench_worker(
    client: httpx.AsyncClient, srv: SglangServer, args: argparse.Namespace, vocab: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    url = srv.cfg.url
    res: dict[str, Any] = {"start_s": srv.start_s, "pid": srv.pid, "prefill": [], "decode": []}
    await generate(client, url, prompt(rng, 32, vocab), 4)  # first-use compiles, not measured
    for n in args.prompt_lens:
        times = []
        for _ in range(args.repeats):
            out = await generate(client, url, prompt(rng, n, vocab), 1)
            times.append(out["wall_s"])
        best = min(times)
        res["prefill"].append(
            {"prompt_len": n, "wall_s": times, "best_s": best, "tok_per_s": n / best}
        )
    for bs in args.decode_batches:
        ttft = (await generate(client, url, prompt(rng, args.decode_prompt, vocab), 1))["wall_s"]
        prompts = [prompt(rng, args.decode_prompt, vocab) for _ in range(bs)]
        t0 = time.perf_counter()
        mid = asyncio.ensure_future(_mid_snapshot(client, srv.cfg.hook_port, 0.5))
        outs = await asyncio.gather(*(generate(client, url, p, args.new_tokens) for p in prompts))
        wall = time.perf_counter() - t0
        snap = await mid
        steps = (await hook(client, srv.cfg.hook_port))["steps"]
        tokens = sum(len(o["output_ids"]) for o in outs)
        res["decode"].append(
            {
                "batch": bs,
                "new_tokens": args.new_tokens,
                "prompt_len": args.decode_prompt,
                "wall_s": wall,
                "tok_per_s": tokens / wall,
                "tok_per_s_after_prefill": tokens / max(1e-9, wall - ttft * 1.0),
                "step_period_s": step_period(steps, bs),
                "hook_mid_run": {
                    k: snap.get(k)
                    for k in ("decode_batch", "kv_used", "kv_capacity", "decode_context", "mode")
                },
            }
        )
    return res


async def _mid_snapshot(client: httpx.AsyncClient, port: int, after: float) -> dict[str, Any]:
    await asyncio.sleep(after)
    return await hook(client, port)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir(args, args.work)
    vocab = vocab_size(model)
    ports = free_ports(2 * args.workers)
    servers = [
        SglangServer(
            SglangConfig(
                python=args.python,
                model_dir=model,
                port=ports[2 * i],
                hook_port=ports[2 * i + 1],
                device=args.device,
                mem_fraction=args.mem_fraction[i] if args.mem_fraction else None,
                load_format=None if args.model_dir else "dummy",
                context_length=args.context_length,
                max_total_tokens=args.max_total_tokens,
                extra_args=tuple(args.extra.split()) if args.extra else (),
                log_path=out / f"sglang-{i}.log",
                start_timeout_s=args.start_timeout,
            )
        )
        for i in range(args.workers)
    ]
    report: dict[str, Any] = {"command": " ".join(sys.argv), "workers": []}
    t0 = time.perf_counter()
    try:
        # One after the other: SGLang sizes its KV pool from the memory free when it starts
        # (--mem-fraction-static is the share of the whole GPU everything may use once this
        # process is up), so a second worker on the same GPU needs a larger fraction.
        for s in servers:
            await s.start()
        report["all_healthy_s"] = time.perf_counter() - t0
        async with httpx.AsyncClient(timeout=600.0) as client:
            for i, srv in enumerate(servers):
                report["workers"].append(await bench_worker(client, srv, args, vocab, seed=i))
                report["workers"][-1]["command"] = " ".join(srv_cmd(srv))
            if len(servers) > 1:
                bs = max(args.decode_batches)
                rng = random.Random(99)
                t1 = time.perf_counter()
                outs = await asyncio.gather(
                    *(
                        generate(
                            client,
                            s.cfg.url,
                            prompt(rng, args.decode_prompt, vocab),
                            args.new_tokens,
                        )
                        for s in servers
                        for _ in range(bs)
                    )
                )
                wall = time.perf_counter() - t1
                report["concurrent_decode"] = {
                    "batch_per_worker": bs,
                    "wall_s": wall,
                    "tok_per_s": sum(len(o["output_ids"]) for o in outs) / wall,
                }
            report["hook_final"] = [await hook(client, s.cfg.hook_port) for s in servers]
            for snap in report["hook_final"]:
                snap["steps"] = snap["steps"][-8:]
    except Exception as exc:
        report["error"] = repr(exc)
    finally:
        await asyncio.gather(*(s.stop() for s in servers))
    (out / "sglang_bench.json").write_text(json.dumps(report, indent=1))
    return report


def srv_cmd(srv: SglangServer) -> list[str]:
    return server_command(srv.cfg)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stack_args(p, work="/tmp/sglang-model", start_timeout=420.0, python=sys.executable,
                   device="cuda")  # fmt: skip
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--mem-fraction",
        type=lambda s: [float(x) for x in s.split(",")],
        default=None,
        help="--mem-fraction-static per worker, comma-separated (0.42,0.85: two on one GPU)",
    )
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--extra", default="", help="more SGLang server flags")
    p.add_argument(
        "--prompt-lens", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096]
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--decode-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32]
    )
    p.add_argument("--decode-prompt", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=256)
    args = p.parse_args()
    report = asyncio.run(main_async(args))
    print(json.dumps({k: v for k, v in report.items() if k != "hook_final"}, indent=1))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
