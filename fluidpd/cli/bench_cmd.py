"""``fluidpd bench``: control-iteration latency and whole-replay simulator speed.

Numbers are printed and written as JSON; nothing here asserts a time (this machine is shared
and noisy), so compare runs side by side.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from fluidpd import __version__
from fluidpd.cli.options import GPU_HELP, MODEL_HELP, PROFILE_HELP, positive_float, positive_int
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.profile import Profile
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.types import SLO, Request, Role
from fluidpd.profiles import resolve_profile
from fluidpd.sim.policies import MECHANISMS, parse_pd
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import build_workload

DEFAULT_OUT = "out/bench"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark the control iteration and the simulator",
        description="Measures one FluidToken control iteration (PPI + DPI + Algorithm 1) at a "
        "given queue depth, and the wall time of a whole simulated replay.",
    )
    p.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument("--profile", default=None, help=PROFILE_HELP)
    p.add_argument(
        "--depth", type=positive_int, default=256, help="prefill queue depth of the iteration"
    )
    p.add_argument(
        "--decode-workers",
        type=positive_int,
        default=4,
        help="decode peers whose budgets the iteration reads",
    )
    p.add_argument("--iterations", type=positive_int, default=3000, help="control iterations timed")
    p.add_argument("--workload", default="azure-staged", help="workload of the timed replay")
    p.add_argument("--rps", type=positive_float, default=30.0, help="rate of the timed replay")
    p.add_argument("--pd", default="4P4D", help="initial split of the timed replay")
    p.add_argument(
        "--policy",
        default="fluidpd",
        choices=sorted(MECHANISMS),
        help="policy of the timed replay",
    )
    p.add_argument(
        "replays",
        nargs="*",
        type=replay_target,
        metavar="WORKLOAD@RPS",
        help="replays to time, e.g. azure-staged@30 long-chat-poisson@2 (replaces --workload "
        "and --rps)",
    )
    p.add_argument(
        "--num-requests",
        type=positive_int,
        default=None,
        help="requests of each timed replay (default: the whole workload; for the synthetic "
        "and long-* workloads it sets how many are drawn)",
    )
    p.add_argument("--repeat", type=positive_int, default=3, help="replay repeats")
    p.add_argument("--skip-replay", action="store_true", help="time the control iteration only")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for bench.json")
    p.set_defaults(func=run)


def replay_target(text: str) -> tuple[str, float]:
    """``WORKLOAD@RPS``."""
    name, sep, rate = text.rpartition("@")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected WORKLOAD@RPS, got {text!r}")
    return name, positive_float(rate)


def _control_setup(
    profile: Profile, depth: int, n_decode: int, seed: int = 0
) -> tuple[Worker, dict[str, Worker], float]:
    """A prefill worker with ``depth`` reserved requests (Azure-like lengths, arrivals spread
    so that the back of the queue is predicted late) and decode workers with live batches."""
    rng = np.random.default_rng(seed)
    slo = SLO(2.0, 0.1)
    cfg = FluidTokenConfig()
    prefill = Worker.create("p0", Role.PREFILL, profile, slo, cfg)
    decode = {
        f"d{i}": Worker.create(f"d{i}", Role.DECODE, profile, slo, cfg) for i in range(n_decode)
    }
    lengths = np.clip(rng.lognormal(np.log(1200), 0.8, depth), 16, 8000).astype(int)
    now = 10.0
    arrivals = now - np.sort(rng.uniform(0.0, 3.0, depth))[::-1]
    rid = 0
    for d in decode.values():
        for _ in range(40):  # a busy decode batch: context and KV in use
            req = Request(rid, 0.0, int(rng.integers(200, 3000)), int(rng.integers(50, 400)))
            rid += 1
            d.decode.add(req)
            d.take_outbox()
            d.decode.handoff_done(req.rid, req.prompt_len, 0.0)
        d.decode.next_batch(0.0)
        d.decode.finish_batch(d.decode.running, 0.02, 0.02)  # type: ignore[arg-type]
        d.take_outbox()
    names = list(decode)
    for i in range(depth):
        req = Request(rid, float(arrivals[i]), int(lengths[i]), 100)
        rid += 1
        prefill.prefill.add(req)
        req.decode_worker = names[i % n_decode]
        prefill.prefill.reserved(req.rid)
    return prefill, decode, now


def _timed(fn: Any, iterations: int) -> dict[str, float]:
    fn()
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    samples.sort()
    return {
        "median_us": round(statistics.median(samples), 2),
        "p90_us": round(samples[int(0.9 * len(samples))], 2),
        "p99_us": round(samples[int(0.99 * len(samples))], 2),
        "min_us": round(samples[0], 2),
    }


def bench_control(profile: Profile, depth: int, n_decode: int, iterations: int) -> dict[str, Any]:
    """Times what a prefill worker does per scheduling iteration: PPI over its queue, the
    paired decode workers' DPI-gated budgets, and Algorithm 1. The scheduler commits only the
    head's split each iteration (``head_only``); the full per-request plan is timed too."""
    prefill, decode, now = _control_setup(profile, depth, n_decode)

    def budgets(ids: Any) -> np.ndarray:
        return np.array([decode[d].decode.steal_budget(1) for d in ids])

    def scheduler_iteration() -> None:
        prefill.prefill.plan(now, budgets, head_only=True)
        for d in decode.values():
            d.decode.dpi_adm()

    def full_plan() -> None:
        prefill.prefill.plan(now, budgets)
        for d in decode.values():
            d.decode.dpi_adm()

    plan = prefill.prefill.plan(now, budgets)
    return {
        "queue_depth": depth,
        "decode_workers": n_decode,
        "iterations": iterations,
        "queue_ppi": round(plan.ppi, 3),
        "requests_with_stealing": int((plan.stolen > 0).sum()),
        "head_stolen_tokens": int(plan.stolen[0]),
        "scheduler_iteration": _timed(scheduler_iteration, iterations),
        "full_algorithm1": _timed(full_plan, iterations),
    }


def bench_replay(
    profile: Profile,
    workload_name: str,
    rps: float,
    pd: str,
    policy: str,
    repeat: int,
    num_requests: int | None = None,
) -> dict[str, Any]:
    n_prefill, n_decode = parse_pd(pd)
    workload = build_workload(
        workload_name, rps, context_limit=profile.context_limit, num_requests=num_requests
    )
    cfg = SimConfig(
        profile=profile,
        slo=SLO(2.0, 0.1),
        n_prefill=n_prefill,
        n_decode=n_decode,
        mechanisms=MECHANISMS[policy],
        noise=0.05,
    )
    walls = []
    cpus = []
    events = 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(workload, cfg)
        walls.append(time.perf_counter() - t0)
        # CPU seconds of this process: on a shared machine the wall time mostly says how many
        # others wanted the cores.
        cpus.append(time.process_time() - c0)
        events = result.events
    return {
        "workload": workload_name,
        "rps": rps,
        "requests": len(workload),
        "mean_prompt": round(float(workload.prompt_lens.mean()), 1),
        "mean_output": round(float(workload.output_lens.mean()), 1),
        "capped_prompts": workload.capped_prompts,
        "pd": pd,
        "policy": policy,
        "repeats": repeat,
        "wall_s_min": round(min(walls), 3),
        "wall_s_median": round(statistics.median(walls), 3),
        "cpu_s_min": round(min(cpus), 3),
        "events": events,
        "simulated_s": round(float(workload.arrivals[-1]), 1),
    }


def run(args: argparse.Namespace) -> int:
    profile = resolve_profile(args.model, args.gpu, args.profile)
    result: dict[str, Any] = {
        "fluidpd_version": __version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "command": "fluidpd " + " ".join(sys.argv[1:]),
    }
    control = bench_control(profile, args.depth, args.decode_workers, args.iterations)
    result["control_iteration"] = control
    head = f"queue depth {control['queue_depth']}, {control['decode_workers']} decode workers"
    for key, label in (
        ("scheduler_iteration", "control iteration (PPI + DPI + Algorithm 1 for the head)"),
        ("full_algorithm1", "full Algorithm 1 (beta for every queued request)"),
    ):
        t = control[key]
        print(
            f"{label}, {head}: median {t['median_us']} us, p90 {t['p90_us']} us, "
            f"p99 {t['p99_us']} us"
        )
    print(
        f"queue PPI {control['queue_ppi']}, {control['requests_with_stealing']} queued requests "
        f"given a suffix, head suffix {control['head_stolen_tokens']} tokens"
    )
    if not args.skip_replay:
        targets = args.replays or [(args.workload, args.rps)]
        replays = [
            bench_replay(profile, name, rps, args.pd, args.policy, args.repeat, args.num_requests)
            for name, rps in targets
        ]
        result["replay"] = replays[0]
        result["replays"] = replays
        for replay in replays:
            print(
                f"replay {replay['workload']} ({replay['requests']} requests, mean prompt "
                f"{replay['mean_prompt']:g}, mean output {replay['mean_output']:g}, "
                f"{replay['pd']}, {replay['policy']}, {replay['rps']:g} rps, "
                f"{replay['simulated_s']} s simulated, {replay['events']} events): "
                f"wall min {replay['wall_s_min']} s, median {replay['wall_s_median']} s, "
                f"CPU {replay['cpu_s_min']} s "
                f"over {replay['repeats']} runs"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0
