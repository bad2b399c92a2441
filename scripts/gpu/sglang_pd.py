"""1P1D through FluidPD on SGLang: two ``fluidpd sidecar --engine sglang`` workers (SGLang's own
P/D, KV over its Mooncake transfer) and FluidPD's router on one machine; then the same prompts
on one plain (non-disaggregated) SGLang server for greedy equivalence.

Measures: each sidecar's SGLang start time, TTFT and decode throughput through the router at
concurrency 1 and C, SGLang's own KV transfer speed/latency gauges on the prefill server, the
decode sidecar's /pressure mid-run (the hook's observables), and whether the greedy text of
each prompt through P/D equals plain SGLang's. Writes OUT/sglang_pd.json.

usage: python3 scripts/gpu/sglang_pd.py --out $OUT [--device cuda:0] [--python python3]
CPU: --device cpu --model-dir DIR --python ~/.cache/fluidpd/sglang-venv/bin/python
     --sidecar-arg=--sglang-max-total-tokens=4096 --plain-arg=--max-total-tokens=4096 --new 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import httpx

from fluidpd.api.sampling import SamplingParams
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports
from fluidpd_sidecar.sglang.wire import new_tokens
from fluidpd_sidecar.stopping import OutputStream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import (
    Stack,
    Worker,
    add_stack_args,
    complete,
    generate,
    model_dir,
    random_ids,
    sidecar_args,
    timed_load,
    vocab_size,
    wait_ready,
    write_json,
)

TRANSFER_METRICS = r"sglang:(kv_transfer_(speed_gb_s|latency_ms)_(sum|count)|num_transfer_failed)"


def start_stack(args: argparse.Namespace, model: Path, out: Path) -> tuple[dict[str, str], Stack]:
    """The two sidecars (p0, d0) and the router, logs and FluidPD's logs in ``out``."""
    pp, dp, rp = free_ports(3)
    stack = Stack(out, None)
    common = sidecar_args(args, model, *args.sidecar_arg)
    workers = [Worker("p0", "prefill", pp), Worker("d0", "decode", dp)]
    for w, frac in zip(workers, (args.mem_p, args.mem_d), strict=True):
        stack.sidecar(w, common, ["--mem-fraction", str(frac)] if args.device != "cpu" else [])
    router = stack.router(rp, model, workers)
    return {"p": workers[0].url, "d": workers[1].url, "router": router}, stack


def checked(r: dict[str, Any]) -> dict[str, Any]:
    """A completion that failed ends the run (its error is the report's)."""
    if r["error"] is not None:
        raise RuntimeError(r["error"])
    return r


def plain_text(md_path: Path, out: dict[str, Any], new: int) -> str:
    md = load_model_dir(md_path)
    s = OutputStream(
        TokenText.from_model_dir(md), SamplingParams(max_new_tokens=new), md.eos_token_ids
    )
    s.feed(new_tokens(out, 0))
    s.end()
    return s.take(final=True)[1]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir(args, args.work)
    vocab = vocab_size(model)
    rng = random.Random(7)
    prompts = [random_ids(rng, n, vocab) for n in (16, 200, 1000)]
    rep: dict[str, Any] = {"command": " ".join(sys.argv)}
    urls, stack = start_stack(args, model, out)
    pd_text: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=600) as c:
            ready = [f"{urls[k]}/readyz" for k in ("p", "d")]
            rep["ready_s"] = await wait_ready(c, stack, ready, args.start_timeout)
            name = (await c.get(f"{urls['router']}/v1/models")).json()["data"][0]["id"]
            rep["sglang"] = {
                k: (await c.get(f"{urls[k]}/v1/internal/sglang")).json() for k in ("p", "d")
            }
            for ids in prompts:
                r = await complete(c, urls["router"], name, ids, args.new, ignore_eos=False)
                pd_text.append(checked(r)["text"])
            for conc in (1, args.concurrency):
                batch = [random_ids(rng, args.prompt, vocab) for _ in range(conc)]
                mid: list[dict[str, Any]] = []

                async def watch(into: list[dict[str, Any]]) -> None:
                    await asyncio.sleep(1.0)
                    into.append((await c.get(f"{urls['d']}/pressure")).json())

                w = asyncio.ensure_future(watch(mid))
                res, wall = await timed_load(c, urls["router"], name, batch, args.new, conc)
                for r in res:
                    checked(r)
                with contextlib.suppress(Exception):
                    await w
                ttfts = sorted(r["ttft_s"] for r in res if r["ttft_s"] is not None)
                rep[f"load_c{conc}"] = {
                    "prompt_len": args.prompt, "new_tokens": args.new, "wall_s": wall,
                    "tok_per_s": sum(r["tokens"] for r in res) / wall,
                    "ttft_median_s": ttfts[len(ttfts) // 2] if ttfts else None,
                    "ttft_max_s": ttfts[-1] if ttfts else None,
                    "lost": sum(r["tokens"] != args.new for r in res),
                    "decode_pressure_mid_run": mid[0] if mid else None,
                }  # fmt: skip
            metrics = (await c.get(f"{rep['sglang']['p']['url']}/metrics")).text
            rep["prefill_sglang_metrics"] = [
                line for line in metrics.splitlines()
                if re.match(TRANSFER_METRICS, line)
            ]  # fmt: skip
    except Exception as exc:
        rep["error"] = repr(exc)
    finally:
        stack.stop()
    if "error" not in rep and not args.no_plain:
        hp, sp = free_ports(2)
        plain = SglangServer(SglangConfig(
            python=args.python, model_dir=model, port=sp, hook_port=hp, device=args.device,
            mem_fraction=args.mem_plain if args.device != "cpu" else None,
            load_format=None if args.model_dir else "dummy", extra_args=tuple(args.plain_arg),
            log_path=out / "plain.log", start_timeout_s=args.start_timeout,
        ))  # fmt: skip
        try:
            await plain.start()
            rep["plain_start_s"] = plain.start_s
            async with httpx.AsyncClient(timeout=600) as c:
                texts = []
                for ids in prompts:
                    got = await generate(c, plain.cfg.url, ids, args.new, ignore_eos=False)
                    texts.append(plain_text(model, got, args.new))
            rep["greedy_equal"] = [a == b for a, b in zip(pd_text, texts, strict=True)]
            rep["greedy_pd_vs_plain"] = list(zip(pd_text, texts, strict=True))
        except Exception as exc:
            rep["plain_error"] = repr(exc)
        finally:
            await plain.stop()
    write_json(out / "sglang_pd.json", rep)
    return rep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stack_args(p, work="/tmp/sglang-model", start_timeout=300.0)
    p.add_argument("--mem-p", type=float, default=0.3)
    p.add_argument("--mem-d", type=float, default=0.6)
    p.add_argument("--mem-plain", type=float, default=0.8)
    p.add_argument("--sidecar-arg", action="append", default=[])
    p.add_argument("--plain-arg", action="append", default=[])
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--no-plain", action="store_true")
    args = p.parse_args()
    rep = asyncio.run(main_async(args))
    print(json.dumps({k: v for k, v in rep.items() if k != "greedy_pd_vs_plain"}, indent=1))
    return 1 if "error" in rep else 0


if __name__ == "__main__":
    raise SystemExit(main())
