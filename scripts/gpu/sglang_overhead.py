"""Overhead of FluidPD on SGLang: the same two SGLang servers (1P1D on one GPU, SGLang's own P/D
with KV over Mooncake) driven two ways, side by side in one run:

- ``fluidpd``: FluidPD's router -> ``fluidpd sidecar --engine sglang --no-fluidtoken`` (stealing
  off, no controller) -> the SGLang servers;
- ``plain``: sglang_minilb.py (SGLang's mini_lb protocol; sglang-router is not staged) straight
  onto the same SGLang servers.

At each concurrency level the two paths take turns (plain, fluidpd, fluidpd, plain, ... ABBA, so
drift and warm-up do not favour one), every request a fresh random prompt (no radix-cache hits),
greedy, ``ignore_eos``. Per path and level: output tokens per second (all tokens / wall),
TTFT median and p90, per-request decode time per token (TPOT); then fluidpd / plain ratios.
Writes OUT/overhead.json after every run (partial results survive a timeout) and prints a table.

usage: python3 scripts/gpu/sglang_overhead.py --out $OUT [--levels 1,8,32] [--rounds 1]
CPU smoke: --device cpu --model-dir DIR --python ~/.cache/fluidpd/sglang-venv/bin/python
           --kv-tokens 4096 --prompt 64 --new 8 --levels 1,2 --no-mem-fraction
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import (
    Stack,
    Worker,
    add_stack_args,
    complete,
    model_dir,
    pct,
    random_ids,
    sidecar_args,
    start_minilb,
    term_as_interrupt,
    timed_load,
    vocab_size,
    wait_ready,
    write_json,
)

from fluidpd_sidecar.sglang.server import free_ports


async def one_run(
    c: httpx.AsyncClient, base: str, model: str, rng: random.Random, args: argparse.Namespace,
    conc: int, vocab: int,
) -> dict[str, Any]:  # fmt: skip
    n = max(conc, args.min_requests)
    prompts = [random_ids(rng, args.prompt, vocab) for _ in range(n)]
    res, wall = await timed_load(c, base, model, prompts, args.new, conc)
    ok = [r for r in res if r["error"] is None and r["ttft_s"] is not None]
    ttft = [r["ttft_s"] for r in ok]
    tpot = [(r["wall_s"] - r["ttft_s"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    return {
        "requests": n, "concurrency": conc, "wall_s": wall,
        "tokens": sum(r["tokens"] for r in ok),
        "tok_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_median_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "tpot_median_s": pct(tpot, 0.5),
        "lost": sum(r["tokens"] != args.new for r in res),
        "errors": sorted({str(r["error"]) for r in res if r["error"]})[:3],
        "ttfts_s": ttft, "tpots_s": tpot,
    }  # fmt: skip


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's runs at one level: tokens over wall time summed, percentiles of all the
    runs' requests pooled."""
    wall = sum(r["wall_s"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    ttft = [x for r in runs for x in r["ttfts_s"]]
    tpot = [x for r in runs for x in r["tpots_s"]]
    return {
        "runs": len(runs), "requests": len(ttft), "tok_per_s": tokens / wall if wall else None,
        "ttft_median_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
        "tpot_median_s": pct(tpot, 0.5), "lost": sum(r["lost"] for r in runs),
    }  # fmt: skip


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(rep: dict[str, Any]) -> str:
    lines = [
        "| conc | path | tok/s | TTFT p50 (ms) | TTFT p90 (ms) | TPOT p50 (ms) | lost |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.1f}"

    for level, v in rep["levels"].items():
        for path in ("plain", "fluidpd"):
            s = v.get(path)
            if not s:
                continue
            tps = "-" if s["tok_per_s"] is None else f"{s['tok_per_s']:.1f}"
            cells = [str(level), path, tps, ms(s["ttft_median_s"]), ms(s["ttft_p90_s"]),
                     ms(s["tpot_median_s"]), str(s["lost"])]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        r = v.get("ratio")
        if r:

            def f(x: float | None) -> str:
                return "-" if x is None else f"{x:.3f}"

            lines.append(f"| {level} | fluidpd/plain | {f(r['tok_per_s'])} | "
                         f"{f(r['ttft_median_s'])} | {f(r['ttft_p90_s'])} | "
                         f"{f(r['tpot_median_s'])} | |")  # fmt: skip
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = model_dir(args, work / "model")
    vocab = vocab_size(model)
    stack = Stack(work, "overhead-bench")
    pp, dp, rp, lp = free_ports(4)
    workers = [Worker("p0", "prefill", pp), Worker("d0", "decode", dp)]
    common = sidecar_args(
        args, model, "--sglang-max-total-tokens", str(args.kv_tokens), "--no-fluidtoken",
        "--log-level", "warning", *args.sidecar_arg,
    )  # fmt: skip
    if not args.no_mem_fraction:
        common += ["--mem-fraction", str(args.mem)]
    rep: dict[str, Any] = {"command": " ".join(sys.argv), "levels": {}}
    t_start = time.monotonic()
    try:
        for w in workers:
            stack.sidecar(w, common, [])
        extra = ["--log-level", "warning", "--first-token-timeout", "300"]
        fluid = stack.router(rp, model, workers, extra)
        lim = httpx.Limits(max_connections=None, max_keepalive_connections=512)
        # A request stuck for 2 minutes counts as lost (an error), not as a hang of the run.
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10), limits=lim) as c:
            rep["ready_s"] = await wait_ready(
                c, stack, [f"{w.url}/readyz" for w in workers] + [f"{fluid}/healthz"],
                args.start_timeout,
            )  # fmt: skip
            print(f"[overhead] stack ready after {rep['ready_s']:.0f} s", flush=True)
            name = (await c.get(f"{fluid}/v1/models")).json()["data"][0]["id"]
            plain = await start_minilb(c, stack, workers, lp, name)
            bases = {"fluidpd": fluid, "plain": plain}
            rng = random.Random(13)
            for path in ("plain", "fluidpd"):  # warm-up (first-use JIT, connections)
                await asyncio.gather(*(
                    complete(c, bases[path], name, random_ids(rng, args.prompt, vocab), 8)
                    for _ in range(4)
                ))  # fmt: skip
            for level in args.levels:
                runs: dict[str, list[dict[str, Any]]] = {"plain": [], "fluidpd": []}
                order = ["plain", "fluidpd", "fluidpd", "plain"] * args.rounds
                for path in order:
                    r = await one_run(c, bases[path], name, rng, args, level, vocab)
                    runs[path].append(r)
                    print(f"[overhead] c={level} {path}: {r['tok_per_s']:.1f} tok/s, TTFT p50 "
                          f"{(r['ttft_median_s'] or 0) * 1000:.1f} ms, lost {r['lost']}",
                          flush=True)  # fmt: skip
                    v: dict[str, Any] = {p: merge(rs) for p, rs in runs.items() if rs}
                    if "plain" in v and "fluidpd" in v:
                        v["ratio"] = {k: ratio(v["fluidpd"][k], v["plain"][k])
                                      for k in ("tok_per_s", "ttft_median_s", "ttft_p90_s",
                                                "tpot_median_s")}  # fmt: skip
                    v["raw"] = runs
                    rep["levels"][str(level)] = v
                    rep["elapsed_s"] = time.monotonic() - t_start
                    write_json(out / "overhead.json", rep)
            ph = await c.get(f"{fluid}/admin/stats", headers=stack.headers)
            rep["router_stats"] = ph.json() if ph.status_code == 200 else ph.text[:300]
    except Exception as exc:
        rep["error"] = repr(exc)
        print(f"[overhead] error: {exc!r}", flush=True)
    finally:
        stack.stop()
        stack.logs(out / "logs.txt")
    rep["elapsed_s"] = time.monotonic() - t_start
    rep["table"] = table(rep)
    write_json(out / "overhead.json", rep)
    return rep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stack_args(p, work="/tmp/sgl-overhead", start_timeout=240.0)
    p.add_argument("--mem", type=float, default=0.8, help="--mem-fraction of each worker")
    p.add_argument("--no-mem-fraction", action="store_true", help="(CPU) pass none")
    p.add_argument("--kv-tokens", type=int, default=131072, help="each worker's KV pool cap")
    p.add_argument("--sidecar-arg", action="append", default=[])
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--min-requests", type=int, default=6, help="requests a run at least sends")
    p.add_argument("--rounds", type=int, default=1, help="ABBA blocks per level")
    args = p.parse_args()
    term_as_interrupt()
    rep = asyncio.run(main_async(args))
    print(rep["table"], flush=True)
    print({k: rep.get(k) for k in ("ready_s", "elapsed_s", "error")}, flush=True)
    return 1 if "error" in rep else 0


if __name__ == "__main__":
    raise SystemExit(main())
