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

from fluidpd.modeldir.synthetic import write_tokenizer
from fluidpd_sidecar.gpu.config import resolve_shape
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports, server_command


def make_model_dir(shape: str, out: Path) -> Path:
    """``config.json`` of the shape (weights: ``--load-format dummy``) and a synthetic tokenizer
    padded to the shape's vocabulary, so the directory is complete for FluidPD's sidecar too."""
    cfg = resolve_shape(shape)
    out.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf_config()
    qwen = bool(getattr(cfg, "qk_norm", False))
    hf["architectures"] = ["Qwen3ForCausalLM" if qwen else "LlamaForCausalLM"]
    hf["model_type"] = "qwen3" if qwen else "llama"
    hf["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    # Padding ids decode to text: with dummy weights greedy decoding picks them most of the time.
    write_tokenizer(out, arch="llama", pad_to=int(hf["vocab_size"]), pad_special=False)
    # The sidecar reads EOS ids from generation_config.json (as serving the real model would).
    tok = json.loads((out / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos = [ids[t] for t in ("<|eot_id|>", "<|end_of_text|>") if t in ids]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out


async def generate(client: httpx.AsyncClient, url: str, ids: list[int], new: int) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True},
    }
    t0 = time.perf_counter()
    r = await client.post(f"{url}/generate", json=body)
    r.raise_for_status()
    out = r.json()
    out["wall_s"] = time.perf_counter() - t0
    return out


def prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab - 10) for _ in range(n)]


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
    model = Path(args.model_dir) if args.model_dir else make_model_dir(args.shape, args.work)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
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
    p.add_argument("--out", required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/sglang-model"))
    p.add_argument("--python", default=sys.executable, help="SGLang's interpreter")
    p.add_argument("--shape", default="llama-3.1-8b")
    p.add_argument("--model-dir", default=None, help="a real model directory instead of a shape")
    p.add_argument("--device", default="cuda")
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
    p.add_argument("--start-timeout", type=float, default=420.0)
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
