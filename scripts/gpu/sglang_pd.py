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
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fluidpd.api.sampling import SamplingParams
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports
from fluidpd_sidecar.sglang.wire import new_tokens
from fluidpd_sidecar.stopping import OutputStream

#: The served model name, read from the router once it is up.
MODEL: list[str] = ["?"]
TRANSFER_METRICS = r"sglang:(kv_transfer_(speed_gb_s|latency_ms)_(sum|count)|num_transfer_failed)"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_bench import make_model_dir  # noqa: E402 - sibling script


def start_stack(
    args: argparse.Namespace, model: Path, out: Path
) -> tuple[dict[str, Any], list[subprocess.Popen[bytes]]]:
    pp, dp, rp = free_ports(3)
    env = {**os.environ, "FLUIDPD_LOG_DIR": str(out)}
    common = [
        "--engine", "sglang", "--device", args.device, "--model-dir", str(model),
        "--sglang-python", args.python, "--sglang-start-timeout", str(args.start_timeout),
        *args.sidecar_arg,
    ]  # fmt: skip
    if not args.model_dir:
        common += ["--sglang-load-format", "dummy"]
    procs = []
    for wid, role, port, frac in (
        ("p0", "prefill", pp, args.mem_p),
        ("d0", "decode", dp, args.mem_d),
    ):
        extra = ["--mem-fraction", str(frac)] if args.device != "cpu" else []
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "fluidpd.cli.main", "sidecar", "--id", wid, "--role", role,
             "--port", str(port), *common, *extra],
            env=env, stdout=(out / f"{wid}.out").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        ))  # fmt: skip
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "fluidpd.cli.main", "router", "--port", str(rp), "--model-dir",
         str(model), "--worker", f"p0=http://127.0.0.1:{pp}", "--worker", f"d0=http://127.0.0.1:{dp}"],
        env=env, stdout=(out / "router.out").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    ))  # fmt: skip
    urls = {
        "p": f"http://127.0.0.1:{pp}",
        "d": f"http://127.0.0.1:{dp}",
        "router": f"http://127.0.0.1:{rp}",
    }
    return urls, procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


async def wait_ready(
    c: httpx.AsyncClient, urls: dict[str, str], procs: list[subprocess.Popen[bytes]], timeout: float
) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode}")
        ok = 0
        for k in ("p", "d"):
            with contextlib.suppress(httpx.HTTPError):
                ok += (await c.get(f"{urls[k]}/readyz")).status_code == 200
        if ok == 2:
            return time.monotonic() - t0
        await asyncio.sleep(1.0)
    raise RuntimeError("sidecars not ready")


async def complete(
    c: httpx.AsyncClient, router: str, ids: list[int], new: int, ignore_eos: bool
) -> dict[str, Any]:
    body = {"model": MODEL[0], "prompt": [ids], "max_tokens": new, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
            "ignore_eos": ignore_eos}  # fmt: skip
    t0 = time.perf_counter()
    ttft, text, n = None, "", 0
    async with c.stream("POST", f"{router}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            d = json.loads(line[5:])
            if d.get("choices"):
                piece = d["choices"][0].get("text", "")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
    return {"ttft_s": ttft, "wall_s": time.perf_counter() - t0, "text": text, "tokens": n}


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
    model = Path(args.model_dir) if args.model_dir else make_model_dir(args.shape, args.work)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rng = random.Random(7)
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(n)] for n in (16, 200, 1000)]
    rep: dict[str, Any] = {"command": " ".join(sys.argv)}
    urls, procs = start_stack(args, model, out)
    pd_text: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=600) as c:
            rep["ready_s"] = await wait_ready(c, urls, procs, args.start_timeout)
            MODEL[0] = (await c.get(f"{urls['router']}/v1/models")).json()["data"][0]["id"]
            rep["sglang"] = {
                k: (await c.get(f"{urls[k]}/v1/internal/sglang")).json() for k in ("p", "d")
            }
            for ids in prompts:
                pd_text.append((await complete(c, urls["router"], ids, args.new, False))["text"])
            for conc in (1, args.concurrency):
                batch = [
                    [rng.randrange(10, vocab - 10) for _ in range(args.prompt)] for _ in range(conc)
                ]
                mid: list[dict[str, Any]] = []

                async def watch(into: list[dict[str, Any]]) -> None:
                    await asyncio.sleep(1.0)
                    into.append((await c.get(f"{urls['d']}/pressure")).json())

                w = asyncio.ensure_future(watch(mid))
                t0 = time.perf_counter()
                res = await asyncio.gather(
                    *(complete(c, urls["router"], ids, args.new, True) for ids in batch)
                )
                wall = time.perf_counter() - t0
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
        stop(procs)
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
                    body = {
                        "input_ids": ids,
                        "sampling_params": {"max_new_tokens": args.new, "temperature": 0.0},
                    }
                    texts.append(
                        plain_text(
                            model,
                            (await c.post(f"{plain.cfg.url}/generate", json=body)).json(),
                            args.new,
                        )
                    )
            rep["greedy_equal"] = [a == b for a, b in zip(pd_text, texts, strict=True)]
            rep["greedy_pd_vs_plain"] = list(zip(pd_text, texts, strict=True))
        except Exception as exc:
            rep["plain_error"] = repr(exc)
        finally:
            await plain.stop()
    (out / "sglang_pd.json").write_text(json.dumps(rep, indent=1))
    return rep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/sglang-model"))
    p.add_argument("--python", default="python3")
    p.add_argument("--shape", default="llama-3.1-8b")
    p.add_argument("--model-dir", default=None)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--mem-p", type=float, default=0.3)
    p.add_argument("--mem-d", type=float, default=0.6)
    p.add_argument("--mem-plain", type=float, default=0.8)
    p.add_argument("--sidecar-arg", action="append", default=[])
    p.add_argument("--plain-arg", action="append", default=[])
    p.add_argument("--start-timeout", type=float, default=300.0)
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
