"""Live 2P2D on the one GPU: four SGLang 0.5.17 servers, each under ``fluidpd sidecar --engine
sglang`` (Llama-3.1-8B shape, dummy weights, SGLang's own P/D with KV over Mooncake TCP), and
``fluidpd replay`` of a slice of the Azure mixed workload against them (``--runs``, default all
three, in this order):

1. ``static``: plain SGLang P/D, sglang_minilb.py (SGLang's mini_lb protocol: a random prefill
   and decode server per request) straight onto the four SGLang servers, no FluidPD code;
2. ``fluidtoken``: FluidPD's router -> the sidecars (FluidToken, the prefill planner pipelined
   with ``--prefill-window``), no controller: the roles stay 2P2D;
3. ``fluidpd``: the same plus FluidPD's controller (FluidRole) for the length of the replay,
   with the predictive switch rule on the router's arrivals (``fluidpd controller --router
   --profile --ttft-slo --tpot-slo``).

Sidecars and controller read one profile: profiles/llama-3.1-8b-GPU.yaml (``--gpu``: the 8B
shape measured on the H200 or the H100) with this deployment's KV pool (``--kv-tokens``),
running cap (``--graph-bs``) and SGLang's Mooncake TCP bandwidth on this host
(``--transfer-gbps``, 0.27 measured in results/sglang/h200-pd-2026-12-02) put in; written to
OUT/profile.yaml.

Same servers, same slice, same rate, one after the other; every SGLang radix cache is flushed
between two runs. The slice (a CSV in the Azure
columns, made here by sglang_slice.py from shared/data/traces) travels in .sglwhl/slice.
Optional CUDA MPS (set up by sglang_live.sh): each worker's SGLang process gets
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE. Writes OUT/live.json (progress, attainment, the router's
switch stats, each worker's /pressure after each run, each run's per-request log),
OUT/results.json (replay's runs) and OUT/table.txt (``fluidpd summary``).

usage: python3 scripts/gpu/sglang_live.py --out $OUT --slice .sglwhl/slice/azure-mixed-slice.csv
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import (
    FLUIDPD,
    Stack,
    Worker,
    add_stack_args,
    complete,
    model_dir,
    random_ids,
    sglang_info,
    sidecar_args,
    start_minilb,
    term_as_interrupt,
    vocab_size,
    wait_ready,
    write_json,
)

from fluidpd.cli.options import mem_fraction, positive_int
from fluidpd.core.pairing import PAIRINGS
from fluidpd_sidecar.sglang.server import free_ports

RUNS = ("static", "fluidtoken", "fluidpd")


def run_labels(runs: list[str]) -> list[tuple[str, str]]:
    """(kind, label) per run, in the order given: a kind's second run is labelled ``kind-2``
    (``--runs static fluidtoken fluidtoken static`` measures the spread, ABBA)."""
    seen: dict[str, int] = {}
    out = []
    for kind in runs:
        seen[kind] = seen.get(kind, 0) + 1
        out.append((kind, kind if seen[kind] == 1 else f"{kind}-{seen[kind]}"))
    return out


#: What one SGLang server holds beside its weights and KV pool (CUDA context, decode graphs,
#: activation buffers), rounded up from the H200 runs' logs.
SERVER_OVERHEAD_BYTES = 2 << 30


def memory_needed(args: argparse.Namespace, bytes_per_token: int, servers: int = 4) -> int:
    """Bytes of GPU memory the ``servers`` SGLang servers of the stack hold together: bf16
    weights of the shape, each KV pool (``--kv-tokens``) and the overhead."""
    from fluidpd_sidecar.gpu.factory import model_config  # noqa: PLC0415

    weights = 2 * model_config(args.shape, args.model_dir).params()["total"]
    return servers * (weights + args.kv_tokens * bytes_per_token + SERVER_OVERHEAD_BYTES)


def fits_message(needed: int, total: int) -> str | None:
    """Why the stack does not fit a card of ``total`` bytes, or None. Four 8B servers with
    65,536-token pools need about 100 GiB: on an 80 GB H100 a prefill server found no memory
    left for its KV pool after 84 s of device time (h100-live-2026-12-06-nofit)."""
    if needed <= total:
        return None
    return (
        f"the four servers need {needed / 2**30:.1f} GiB (weights, --kv-tokens pools, "
        f"{SERVER_OVERHEAD_BYTES / 2**30:.0f} GiB each beside), this card has "
        f"{total / 2**30:.1f} GiB: lower --kv-tokens or use a larger card"
    )


def shipped_profile(args: argparse.Namespace) -> Path:
    """The shipped 8B profile of ``--gpu``."""
    return Path(__file__).resolve().parents[2] / "profiles" / f"llama-3.1-8b-{args.gpu}.yaml"


def live_profile_data(args: argparse.Namespace) -> dict[str, Any]:
    """The shipped ``--gpu`` 8B profile, as read."""
    import yaml  # noqa: PLC0415 - FluidPD's dependency, not the script's

    data: dict[str, Any] = yaml.safe_load(shipped_profile(args).read_text())
    return data


def live_profile(args: argparse.Namespace, out: Path) -> Path:
    """The ``--gpu`` 8B profile with this deployment's KV pool, running cap and transfer speed."""
    import yaml  # noqa: PLC0415 - FluidPD's dependency, not the script's

    from fluidpd.core.profile import Profile  # noqa: PLC0415

    data = live_profile_data(args)
    data["name"] = f"llama-3.1-8b-{args.gpu}-sglang-live"
    data["kv"]["capacity_tokens"] = args.kv_tokens
    data["max_running_requests"] = args.graph_bs
    data["transfer"]["bandwidth_gb_per_s"] = args.transfer_gbps
    data["notes"] = (
        f"{data.get('notes', '')}\nsglang_live.py: {shipped_profile(args).name} with this "
        f"deployment's KV pool ({args.kv_tokens} tokens a worker), running cap "
        f"({args.graph_bs}) and SGLang's Mooncake TCP bandwidth ({args.transfer_gbps} GB/s; "
        "0.27 on the H200 host, h200-pd-2026-12-02)."
    )
    Profile.model_validate(data)
    path = out / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def replay(
    args: argparse.Namespace, endpoint: str, label: str, out: Path, token: str, seed: int = 0
) -> dict[str, Any]:
    argv = [
        *FLUIDPD, "replay", "--endpoint", endpoint, "--workload", args.slice,
        "--rps", str(args.rps), "--num-requests", str(args.requests), "--seed", str(seed),
        "--context-limit", str(args.context_limit), "--ttft-slo", str(args.ttft_slo),
        "--tpot-slo", str(args.tpot_slo), "--timeout", str(args.request_timeout),
        "--label", label, "--model-name", args.model_name, "--gpu", args.gpu, "--pd", "2P2D",
        "--out", str(out), "--quiet", "--no-plots",
    ]  # fmt: skip
    t0 = time.monotonic()
    env = {**os.environ, "FLUIDPD_ADMIN_TOKEN": token}
    print(f"[live] replay {label} -> {endpoint}", flush=True)
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=args.replay_timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        # Killed: this label's results are lost, the next run still gets its turn.
        out_text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else ""
        print(f"[live] replay {label}: over {args.replay_timeout:.0f} s, killed", flush=True)
        return {"rc": "timeout", "wall_s": time.monotonic() - t0, "tail": out_text[-2000:],
                "seed": seed}  # fmt: skip
    tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    print("\n".join(tail), flush=True)
    return {"rc": done.returncode, "wall_s": time.monotonic() - t0, "tail": tail, "seed": seed}


async def flush_caches(c: httpx.AsyncClient, stack: Stack, workers: list[Worker]) -> bool:
    """Empty every SGLang server's radix cache (SGLang's ``/flush_cache``; it refuses while
    requests run), so the second run's prompts, the same as the first's, hit no cached prefix."""
    ok = True
    for w in workers:
        info = await sglang_info(c, stack, w)
        for _ in range(20):
            with contextlib.suppress(httpx.HTTPError):
                if (await c.post(f"{info['url']}/flush_cache", timeout=10)).status_code == 200:
                    break
            await asyncio.sleep(1.0)
        else:
            ok = False
    return ok


async def pressures(c: httpx.AsyncClient, workers: list[Worker]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for w in workers:
        try:
            got[w.wid] = (await c.get(f"{w.url}/pressure", timeout=5)).json()
        except (httpx.HTTPError, ValueError) as exc:
            got[w.wid] = repr(exc)
    return got


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    model = model_dir(args, work / "model")
    vocab = vocab_size(model)
    token = "live-bench"
    stack = Stack(work, token)
    ports = free_ports(6)
    workers = [
        Worker("p0", "prefill", ports[0]), Worker("p1", "prefill", ports[1]),
        Worker("d0", "decode", ports[2]), Worker("d1", "decode", ports[3]),
    ]  # fmt: skip
    if args.mps:
        for w in workers:
            pctv = args.mps_prefill if w.role == "prefill" else args.mps_decode
            w.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pctv)
    profile = live_profile(args, out)
    common = sidecar_args(
        args, model, "--sglang-max-total-tokens", str(args.kv_tokens), "--profile", str(profile),
        "--sglang-prefill-window", str(args.prefill_window),
        "--mem-fraction", str(args.mem), "--ttft-slo", str(args.ttft_slo),
        "--tpot-slo", str(args.tpot_slo), "--log-level", "warning",
        f"--sglang-arg=--context-length={args.context_limit}",
        "--sglang-arg=--disable-piecewise-cuda-graph",
        f"--sglang-arg=--cuda-graph-max-bs-decode={args.graph_bs}",
        f"--sglang-arg=--max-running-requests={args.graph_bs}",
        *args.sidecar_arg,
    )  # fmt: skip
    rep: dict[str, Any] = {
        "command": " ".join(sys.argv), "mps": args.mps, "slice": args.slice, "rps": args.rps,
        "requests": args.requests, "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo},
        "kv_tokens_per_worker": args.kv_tokens, "mem_fraction": args.mem, "runs": {},
        "prefill_window": args.prefill_window, "pairing": args.pairing, "profile": str(profile),
    }  # fmt: skip
    t_start = time.monotonic()
    replay_out = work / "replay"
    try:
        for w in workers:
            stack.sidecar(w, common, [])
        fluid = stack.router(ports[4], model, workers, ["--log-level", "warning",
                             "--first-token-timeout", str(args.request_timeout),
                             "--pairing", args.pairing])  # fmt: skip
        lim = httpx.Limits(max_connections=None, max_keepalive_connections=512)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10), limits=lim) as c:
            rep["ready_s"] = await wait_ready(
                c, stack, [f"{w.url}/readyz" for w in workers] + [f"{fluid}/healthz"],
                args.start_timeout,
            )  # fmt: skip
            print(f"[live] 2P2D ready after {rep['ready_s']:.0f} s", flush=True)
            rep["pressure_idle"] = await pressures(c, workers)
            write_json(out / "live.json", rep)
            name = (await c.get(f"{fluid}/v1/models")).json()["data"][0]["id"]
            static = await start_minilb(c, stack, workers, ports[5], name)
            rng = random.Random(5)
            for base in (static, fluid):  # warm-up: every P/D pair, first-use JIT
                await asyncio.gather(*(
                    complete(c, base, name, random_ids(rng, 256, vocab), 8)
                    for _ in range(8)
                ))  # fmt: skip
            rep["flushed"] = {}
            for k, (kind, label) in enumerate(run_labels(args.runs)):
                if k:
                    # Same prompts again on empty caches; if a flush is refused, other prompts
                    # (seed k: same lengths and arrival times) so that no cached prefix
                    # favours a later run.
                    rep["flushed"][label] = await flush_caches(c, stack, workers)
                if kind == "fluidpd":
                    stack.start("controller", [
                        *FLUIDPD, "controller", "--router", fluid, "--profile", str(profile),
                        "--ttft-slo", str(args.ttft_slo), "--tpot-slo", str(args.tpot_slo),
                        "--switch-rule", "predictive", "--log-level", "info",
                        *args.controller_arg,
                    ])  # fmt: skip
                    await asyncio.sleep(2.0)
                seed = 0 if rep["flushed"].get(label, True) else k
                base = static if kind == "static" else fluid
                rep["runs"][label] = replay(args, base, label, replay_out, token, seed)
                rep["runs"][label]["pressure_after"] = await pressures(c, workers)
                rep["runs"][label]["sglang_after"] = {
                    w.wid: await sglang_info(c, stack, w) for w in workers
                }
                rep["elapsed_s"] = time.monotonic() - t_start
                write_json(out / "live.json", rep)
                if kind == "fluidpd":
                    stack.stop("controller")  # a later run of another kind runs without it
                if kind == "static" and "static" not in args.runs[k + 1 :]:
                    stack.stop("minilb")
            stats = await c.get(f"{fluid}/admin/stats", headers=stack.headers)
            rep["router_stats"] = stats.json() if stats.status_code == 200 else stats.text[:300]
            roles = {}
            for w in workers:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    roles[w.wid] = (await c.get(f"{w.url}/role", timeout=5)).json()
            rep["roles_after"] = roles
    except Exception as exc:
        rep["error"] = repr(exc)
        print(f"[live] error: {exc!r}", flush=True)
    finally:
        # Also on SIGTERM (KeyboardInterrupt here): stop every server, keep what was measured.
        stack.stop()
        stack.logs(out / "logs.txt", lines=args.log_lines)
        rep["elapsed_s"] = time.monotonic() - t_start
        results = replay_out / "results.json"
        if results.exists():
            shutil.copy(results, out / "results.json")
            summary = subprocess.run([*FLUIDPD, "summary", str(replay_out)], capture_output=True,
                                     text=True, check=False, timeout=60)  # fmt: skip
            rep["table"] = summary.stdout
            (out / "table.txt").write_text(summary.stdout + summary.stderr)
            print(summary.stdout, flush=True)
        # Each run's per-request log (replay's DIR/requests/), inside live.json: the machine
        # returns a few files a call, and one run's attainment hides how its TTFTs moved.
        rep["requests"] = {
            f.stem: [json.loads(line) for line in f.read_text().splitlines() if line]
            for f in sorted((replay_out / "requests").glob("*.jsonl"))
        }
        write_json(out / "live.json", rep)
    return rep


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_stack_args(p, work="/tmp/sgl-live", start_timeout=200.0)
    p.add_argument("--slice", required=True, help="Azure-format CSV (sglang_slice.py)")
    p.add_argument("--mem", type=mem_fraction, default=0.8)
    p.add_argument(
        "--kv-tokens", type=positive_int, default=65536, help="each worker's KV pool cap"
    )
    p.add_argument("--graph-bs", type=int, default=64, help="decode graph and running cap")
    p.add_argument("--mps", action="store_true", help="CUDA MPS is running (sglang_live.sh)")
    p.add_argument("--mps-prefill", type=int, default=50, help="MPS SM percentage, prefill")
    p.add_argument("--mps-decode", type=int, default=50, help="MPS SM percentage, decode")
    p.add_argument("--model-name", default="llama-3.1-8b-dummy", help="recorded in results")
    p.add_argument("--gpu", default="h200", choices=("h200", "h100"),
                   help="the profile sidecars and controller read; in results")  # fmt: skip
    p.add_argument("--rps", type=float, default=2.0)
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--context-limit", type=int, default=8192)
    p.add_argument("--ttft-slo", type=float, default=3.0)
    p.add_argument("--tpot-slo", type=float, default=0.05)
    p.add_argument("--request-timeout", type=float, default=30.0, help="no first token: failed")
    p.add_argument("--replay-timeout", type=float, default=90.0, help="one replay's limit, s")
    p.add_argument(
        "--runs",
        nargs="+",
        choices=RUNS,
        default=list(RUNS),
        help="in this order; a kind may repeat (its later runs: kind-2, ...)",
    )
    p.add_argument("--prefill-window", type=int, default=4,
                   help="the sidecars' --sglang-prefill-window")  # fmt: skip
    p.add_argument("--pairing", choices=PAIRINGS, default="round-robin",
                   help="FluidPD router's P/D pairing (static runs draw at random)")  # fmt: skip
    p.add_argument("--transfer-gbps", type=float, default=0.27,
                   help="KV transfer GB/s in the profile (SGLang's Mooncake TCP here)")  # fmt: skip
    p.add_argument("--log-lines", type=int, default=60, help="tail of each log in logs.txt")
    p.add_argument("--sidecar-arg", action="append", default=[])
    p.add_argument("--controller-arg", action="append", default=[])
    return p


def main() -> int:
    p = parser()
    args = p.parse_args()
    if args.device.startswith("cuda"):
        import torch  # noqa: PLC0415 - on the GPU machine only

        if not torch.cuda.is_available():
            p.error(f"--device {args.device}: no CUDA device here (--device cpu runs on CPU)")
        per_token = int(live_profile_data(args)["kv"]["bytes_per_token"])
        why = fits_message(memory_needed(args, per_token), torch.cuda.mem_get_info()[1])
        if why:
            p.error(f"--kv-tokens: {why}")
    term_as_interrupt()
    rep = asyncio.run(main_async(args))
    print({k: rep.get(k) for k in ("ready_s", "elapsed_s", "error")}, flush=True)
    return 1 if "error" in rep else 0


if __name__ == "__main__":
    raise SystemExit(main())
