"""``fluidpd drill``: operational drills on a fresh local deployment, written as JSON.

- ``switches``: N in-place role switches in both directions under load;
- ``kill``: SIGKILL one worker under load (FluidPD policy, so the controller is running);
- ``chaos``: SIGKILL and restart random sidecars, the router and the controller under load;
- ``router-overhead``: the router against calling a sidecar pair directly, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import non_negative_float, positive_float, positive_int, steal_ratio

#: A synthetic profile whose steps take well under a millisecond, so that the router
#: overhead drill measures the serving path rather than simulated model compute.
FAST_PROFILE = """\
name: serving-path
model: serving-path
gpu: cpu
context_limit: 32768
max_running_requests: 4096
prefill: {c1_ms_per_token: 0.001, c0_ms: 0.5}
suffix: {s1_ms_per_token: 0.001, s0_ms: 0.2}
decode: {a_c_ms_per_token: 0.0, a_n_ms_per_request: 0.001, a_0_ms: 0.5}
kv: {capacity_tokens: 10000000, bytes_per_token: 1024}
transfer: {bandwidth_gb_per_s: 100, base_latency_ms: 0.05}
switch: {to_decode_ms: 1, to_prefill_ms: 1}
sources: ["synthetic: measures the serving path, not a model"]
"""


PD_HELP = "the deployment's split, e.g. 3P3D"
RPS_HELP = "open-loop load, req/s"
OUT_HELP = "JSON result file"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("drill", help="operational drills on a local deployment (JSON out)")
    drills = p.add_subparsers(dest="drill", required=True, parser_class=type(p))
    s = drills.add_parser("switches", help="role switches in both directions under load")
    s.add_argument("--pd", default="3P3D", help=PD_HELP)
    s.add_argument(
        "--switches", type=positive_int, default=20, help="role switches, alternating directions"
    )
    s.add_argument("--rps", type=positive_float, default=8.0, help=RPS_HELP)
    s.add_argument(
        "--engine",
        choices=("sim", "gpu"),
        default="sim",
        help="sim: steps timed by the profile; gpu: the tiny-llama torch engine on CPU with real "
        "KV through shared memory",
    )
    s.add_argument(
        "--settle", type=positive_float, default=1.0, help="seconds between two switches"
    )
    s.add_argument("--out", default="out/drills/switches.json", help=OUT_HELP)
    s.set_defaults(func=run_switches)
    k = drills.add_parser("kill", help="SIGKILL a worker under load")
    k.add_argument("--pd", default="3P3D", help=PD_HELP)
    k.add_argument(
        "--worker", default=None, help="worker to kill (default: the busiest decode worker)"
    )
    k.add_argument("--rps", type=positive_float, default=8.0, help=RPS_HELP)
    k.add_argument("--out", default="out/drills/kill.json", help=OUT_HELP)
    k.set_defaults(func=run_kill)
    c = drills.add_parser(
        "chaos", help="SIGKILL and restart random sidecars, the router and the controller"
    )
    c.add_argument("--pd", default="3P3D", help=PD_HELP)
    c.add_argument(
        "--duration", type=positive_float, default=600.0, help="seconds of kills under load"
    )
    c.add_argument("--rps", type=positive_float, default=4.0, help=RPS_HELP)
    c.add_argument(
        "--gap",
        type=_gap,
        default=(2.0, 6.0),
        metavar="MIN,MAX",
        help="seconds between all-ready and the next kill, drawn uniformly from [MIN, MAX]",
    )
    c.add_argument(
        "--stream-share",
        type=steal_ratio,  # any number in [0, 1]
        default=0.25,
        help="share of the requests streamed (SSE), in [0, 1]",
    )
    c.add_argument(
        "--switch-share",
        type=steal_ratio,  # any number in [0, 1]
        default=0.4,
        help="share of the kills made just after the drill starts a role switch (then the "
        "switching worker, a migration target, the router or the controller is killed)",
    )
    c.add_argument("--seed", type=int, default=0, help="kills, gaps and load are drawn from it")
    c.add_argument(
        "--run-dir", default=None, help="keep the stack's logs here (default: a temporary one)"
    )
    c.add_argument("--out", default="out/drills/chaos.json", help=OUT_HELP)
    c.set_defaults(func=run_chaos)
    o = drills.add_parser("router-overhead", help="router vs direct sidecar calls")
    o.add_argument("--rps", type=positive_float, default=200.0, help=RPS_HELP)
    o.add_argument(
        "--duration", type=positive_float, default=20.0, help="seconds of load on each path"
    )
    o.add_argument("--prompt-len", type=positive_int, default=16, help="prompt tokens")
    o.add_argument(
        "--prompt-format",
        choices=("ids", "text"),
        default="ids",
        help="ids: token-id prompts; text: text the router tokenizes (the direct path sends "
        "its ids), so the difference includes tokenization",
    )
    o.add_argument("--out", default="out/drills/router-overhead.json", help=OUT_HELP)
    o.set_defaults(func=run_overhead)


def _write(out: str, result: dict[str, Any]) -> int:
    result["command"] = "fluidpd " + " ".join(sys.argv[1:])
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


#: The tiny CPU engine's deployment for drills: a 4K context, real KV bytes through shm.
TINY_GPU_PROFILE = FAST_PROFILE.replace("context_limit: 32768", "context_limit: 4096").replace(
    "capacity_tokens: 10000000", "capacity_tokens: 200000"
)


def _engine_args(engine: str, tmp: Path) -> tuple[str, ...]:
    if engine == "sim":
        return ()
    profile = tmp / "tiny-gpu.yaml"
    profile.write_text(TINY_GPU_PROFILE)
    return (
        "--engine", "gpu", "--engine-model", "tiny-llama", "--device", "cpu",
        "--dtype", "float32", "--kv-transfer", "shm", "--kv-arena-mib", "64",
        "--profile", str(profile),
    )  # fmt: skip


def run_switches(args: argparse.Namespace) -> int:
    from fluidpd.drills.stack import LocalStack
    from fluidpd.drills.switches import switch_drill

    with tempfile.TemporaryDirectory() as tmp:
        # A loaded machine (CI, shared hosts) can take minutes to start every process.
        extra = (*_engine_args(args.engine, Path(tmp)), "--ready-timeout", "300")
        with LocalStack(Path(tmp) / "stack", args.pd, "static", *extra) as stack:
            model = "serving-path" if args.engine == "gpu" else "llama-3.1-8b"
            result = asyncio.run(
                switch_drill(
                    stack.endpoint, stack.token, model, args.switches, args.rps,
                    settle_s=args.settle,
                )
            )  # fmt: skip
            result["orphans"] = stack.stop()
    result["pd"] = args.pd
    result["rps"] = args.rps
    result["engine"] = args.engine
    return _write(args.out, result)


def run_kill(args: argparse.Namespace) -> int:
    from fluidpd.drills.kill import kill_drill
    from fluidpd.drills.stack import LocalStack

    with tempfile.TemporaryDirectory() as tmp, LocalStack(Path(tmp), args.pd, "fluidpd") as stack:
        pids = stack.pids()
        if args.worker is not None and args.worker not in pids:
            raise UserError(f"--worker: no worker {args.worker!r} in a {args.pd} deployment")
        result = asyncio.run(
            kill_drill(
                stack.endpoint, "llama-3.1-8b", args.worker, pids, args.rps,
                controller_log=Path(tmp) / "controller.log", token=stack.token,
            )
        )  # fmt: skip
        result["orphans"] = stack.stop()
    result["pd"] = args.pd
    return _write(args.out, result)


def _gap(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}")
    lo, hi = (non_negative_float(x.strip()) for x in parts)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"MIN must not exceed MAX, got {text!r}")
    return lo, hi


def run_chaos(args: argparse.Namespace) -> int:
    from fluidpd.drills.chaos import chaos_drill
    from fluidpd.drills.stack import LocalStack, free_port_block

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "stack"
        if args.run_dir and run_dir.exists() and any(run_dir.iterdir()):
            raise UserError(f"--run-dir: {run_dir} is not empty")
        metrics_port = free_port_block(1)
        metrics = ("--controller-metrics-port", str(metrics_port))
        with LocalStack(run_dir, args.pd, "fluidpd", "--ready-timeout", "300", *metrics) as stack:
            result = asyncio.run(
                chaos_drill(
                    run_dir, stack.endpoint, stack.workers, stack.token, "llama-3.1-8b",
                    args.duration, args.rps, args.gap,
                    controller_metrics=f"http://127.0.0.1:{metrics_port}/metrics",
                    stream_share=args.stream_share, switch_share=args.switch_share, seed=args.seed,
                )
            )  # fmt: skip
            result["orphans"] = stack.stop()
    result["pd"] = args.pd
    return _write(args.out, result)


def run_overhead(args: argparse.Namespace) -> int:
    from fluidpd.drills.overhead import router_overhead
    from fluidpd.drills.stack import LocalStack

    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "serving-path.yaml"
        profile.write_text(FAST_PROFILE)
        extra = ("--profile", str(profile), "--noise", "0")
        with LocalStack(Path(tmp) / "stack", "1P1D", "static", *extra) as stack:
            result = asyncio.run(
                router_overhead(
                    stack.endpoint, "serving-path", stack.workers["w0"], stack.workers["w1"],
                    stack.token, args.rps, args.duration, args.prompt_len,
                    prompt_format=args.prompt_format,
                )
            )  # fmt: skip
            result["orphans"] = stack.stop()
    return _write(args.out, result)
