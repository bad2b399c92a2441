"""``fluidpd up``: a whole local deployment (sidecars, router, controller) on loopback.

Every component is its own process, started the way a deployment would start it
(``fluidpd sidecar|router|controller``), with its log under the run directory. Children die
with the parent even if the parent is killed with SIGKILL (Linux parent-death signal), and
Ctrl-C / SIGTERM stops them all in order.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fluidpd import listeners, procs
from fluidpd.api.commands import (
    ENGINES,
    TRANSFERS,
    GpuEngineArgs,
    ModelRef,
    RouterCommand,
    SidecarCommand,
    SimEngineArgs,
)
from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    GPU_HELP,
    LOG_LEVELS,
    MODEL_HELP,
    PROFILE_HELP,
    SEED_HELP,
    add_float,
    add_gpu_engine_options,
    add_model_dir_option,
    check_cuda_ipc,
    check_gpu_devices,
    load_model_dir_option,
    port_number,
    positive_int,
    steal_ratio,
)
from fluidpd.cli.policy_options import (
    add_fluidrole_options,
    add_fluidtoken_options,
    add_slo_options,
    fluidrole_argv,
    fluidrole_config,
    fluidtoken_config,
    slo_config,
)
from fluidpd.cli.sidecar_cmd import (
    add_sglang_options,
    check_engine_options,
    sglang_sidecar_args,
)
from fluidpd.core.pairing import PAIRINGS
from fluidpd.profiles import resolve_profile
from fluidpd.sim.policies import MECHANISMS, parse_pd

LIVE_POLICIES = ("static", "fluidtoken", "fluidrole", "fluidpd")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="start a local FluidPD deployment (router + sidecars + controller)",
        description="Starts N worker sidecars (sim, gpu or sglang engine), the router and, for "
        "policies with FluidRole, the controller, as local processes on loopback. Prints the "
        "endpoint and runs until Ctrl-C or SIGTERM, then stops everything.",
    )
    p.add_argument(
        "--pd", default="4P4D", help="initial split: NP MD, e.g. 4P4D (4 prefill, 4 decode)"
    )
    p.add_argument(
        "--policy",
        choices=LIVE_POLICIES,
        default="fluidpd",
        help="static: fixed split; fluidtoken: decode workers steal prefill suffixes; "
        "fluidrole: the controller switches roles; fluidpd: both",
    )
    p.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument("--profile", default=None, help=PROFILE_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address the router listens on")
    p.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="port of the router (the OpenAI API); 0: any free port, and the sidecars too "
        "(the run directory's endpoint and workers files name them once it is up)",
    )
    p.add_argument(
        "--base-port",
        type=positive_int,
        default=None,
        help="first sidecar port, the others follow it (default: --port + 101; with --port 0, "
        "free ports)",
    )
    p.add_argument("--run-dir", default=None, help="logs go here (default runs/up-<time>)")
    add_float(p, "--noise", 0.05, "sim engine: log-normal noise on step times", allow_zero=True)
    add_float(p, "--drift", 1.0, "sim engine: true time / profile prediction")
    p.add_argument("--seed", type=int, default=0, help=SEED_HELP + " (sim engine noise)")
    p.add_argument(
        "--adaptive", action="store_true", help="recalibrate the predictors online (off: paper)"
    )
    p.add_argument(
        "--kv-transfer",
        choices=TRANSFERS,
        default="sim",
        help="KV hand-off: modelled time, real bytes over mooncake's TCP transport, real "
        "bytes through shared memory (one host), or GPU to GPU through CUDA IPC handles (one "
        "host, CUDA devices); the gpu engine needs mooncake, shm or cuda-ipc",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="sim",
        help="sim: profile-timed steps; gpu: the torch transformer; sglang: one SGLang server "
        "per worker, supervised by its sidecar (needs --model-dir) (--device: one device for "
        "every worker, or a comma-separated list, worker i on entry i mod its length, e.g. "
        "cuda:0,cuda:1,...,cuda:7 for one worker per GPU)",
    )
    add_model_dir_option(p)
    add_gpu_engine_options(p)
    add_sglang_options(p)
    p.add_argument(
        "--force-steal",
        type=steal_ratio,
        default=None,
        metavar="BETA",
        help="testing: every prompt runs with stealing ratio BETA in [0, 1] (the decode worker "
        "computes its last BETA share), whatever FluidToken decides (default: FluidToken "
        "decides)",
    )
    p.add_argument(
        "--kv-arena-mib",
        type=positive_int,
        default=1024,
        help="mooncake/shm: registered host memory per sidecar for KV hand-offs, MiB "
        "(cuda-ipc: GPU memory of the sidecar's device)",
    )
    p.add_argument(
        "--pairing",
        choices=PAIRINGS,
        default="round-robin",
        help="how the router pairs a prefill with a decode worker (fluidpd router --help)",
    )
    add_float(p, "--first-token-timeout", 60.0, "router: cancel without a first token after, s")
    p.add_argument(
        "--admin-token",
        default=os.environ.get("FLUIDPD_ADMIN_TOKEN"),
        help="bearer token for internal/admin endpoints (default: $FLUIDPD_ADMIN_TOKEN, else a "
        "random one per run)",
    )
    add_slo_options(p)
    add_fluidtoken_options(p)
    add_fluidrole_options(p)
    p.add_argument(
        "--controller-metrics-port",
        type=positive_int,
        default=None,
        help="the controller serves its Prometheus metrics on this port (default: off)",
    )
    p.add_argument(
        "--ready-timeout",
        type=positive_int,
        default=60,
        help="give up if a component does not answer its health check within this, s",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default="info",
        help="log level of every process it starts; at info each logs its requests' life cycle "
        "(admitted, prefill done, stolen, migrated, finished, failed) into <run-dir>/*.log",
    )
    p.set_defaults(func=run)


class Stack:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._reported: set[str] = set()

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        listener: socket.socket | None = None,
    ) -> None:
        """Start ``fluidpd <argv>`` as ``name``; it serves on ``listener``, which this process
        then closes (the child holds the port alone: when it dies, the port refuses)."""
        cmd = [sys.executable, "-m", "fluidpd.cli.main", *argv]
        (self.run_dir / f"{name}.cmd").write_text(shlex.join(cmd) + "\n")
        fds: tuple[int, ...] = ()
        if listener is not None:
            env = {**env, **listeners.handoff_env(listener)}
            fds = (listener.fileno(),)
        # `up` starts no threads, so a pre-exec hook is safe here.
        log = self.run_dir / f"{name}.log"
        proc = procs.spawn(cmd, log, env=env, append=False, pass_fds=fds)
        if listener is not None:
            listener.close()
        (self.run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        self.procs.append((name, proc))

    def stop(self, timeout: float = 10.0) -> None:
        # Controller first (no switch starts while stopping), then the router, then workers.
        procs.stop([proc for _, proc in reversed(self.procs)], timeout)

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs if proc.poll() is not None]

    def _exit_line(self, name: str, proc: subprocess.Popen[bytes]) -> str:
        """``name`` exited: its status and its log's last line."""
        lines = (self.run_dir / f"{name}.log").read_text(errors="replace").splitlines()
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return f"{name} exited with status {proc.returncode}: {last}"

    def not_up(self, pending: list[str]) -> str:
        """Why the stack did not come up, in one line: each process that exited, with its
        status and its log's last line (a sidecar whose engine could not start says why
        there), else what never answered."""
        why = [self._exit_line(name, proc) for name, proc in self.procs if proc.poll() is not None]
        if not why:
            why = [f"no answer from {', '.join(pending)}"]
        return f"the stack did not come up ({'; '.join(why)}); see the logs in {self.run_dir}"

    def report_exits(self) -> None:
        """Once up, say on stdout when a part exits (the others keep serving: the router drops
        a dead worker), so that a run's output tells what happened to it."""
        for name, proc in self.procs:
            if name not in self._reported and proc.poll() is not None:
                self._reported.add(name)
                print(f"{self._exit_line(name, proc)} (see {name}.log)", flush=True)


def _bind(option: str, host: str, port: int) -> socket.socket:
    try:
        return listeners.bind(host, port)
    except OSError as exc:
        raise UserError(f"{option}: cannot listen on {exc.strerror}") from None


def run(args: argparse.Namespace) -> int:
    n_prefill, n_decode = parse_pd(args.pd)
    profile = resolve_profile(args.model, args.gpu, args.profile)
    slo_config(args), fluidtoken_config(args), fluidrole_config(args)  # validate before starting
    model_dir = load_model_dir_option(args)
    model = ModelRef(
        args.model,
        args.gpu,
        args.profile,
        str(model_dir.path.resolve()) if args.model_dir else None,
    )
    check_engine_options(args)
    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    if not devices:
        raise UserError("--device: empty")
    if args.engine == "gpu":
        check_gpu_devices(devices)
    if args.kv_transfer == "cuda-ipc":
        check_cuda_ipc(devices)
    n_workers = n_prefill + n_decode
    if args.base_port:
        wanted = list(range(args.base_port, args.base_port + n_workers))
    elif args.port == 0:
        wanted = [0] * n_workers
    else:
        wanted = list(range(args.port + 101, args.port + 101 + n_workers))
    if args.port and args.port in wanted:
        raise UserError("--base-port: sidecar ports would include the router's --port")
    # Every port is bound here, before anything starts, and handed to its process.
    router_socket = _bind("--port", args.host, args.port)
    worker_sockets = [_bind("--base-port", args.host, port) for port in wanted]
    ports = [listeners.port_of(sock) for sock in worker_sockets]
    router_port = listeners.port_of(router_socket)
    run_dir = Path(args.run_dir or f"runs/up-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    token = args.admin_token or secrets.token_urlsafe(16)
    # The admin API is unusable without it: the user gets it in a file only they can read
    # (and on stdout when it was generated here, not given).
    token_file = run_dir / "admin-token"
    token_file.touch(mode=0o600)
    token_file.chmod(0o600)
    token_file.write_text(token + "\n")
    env = {**os.environ, "FLUIDPD_ADMIN_TOKEN": token}
    # SGLang servers' logs go beside the sidecars' (not into the current directory).
    env.setdefault("FLUIDPD_LOG_DIR", str(run_dir))
    mech = MECHANISMS[args.policy]
    stack = Stack(run_dir)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    workers: list[str] = []
    try:
        for i, port in enumerate(ports):
            wid = f"w{i}"
            role = "prefill" if i < n_prefill else "decode"
            sidecar = SidecarCommand(
                worker_id=wid,
                role=role,
                host=args.host,
                port=port,
                model=model,
                ttft_slo=args.ttft_slo,
                tpot_slo=args.tpot_slo,
                eta=args.eta,
                token_dpi_load_high=args.token_dpi_load_high,
                token_split_budget=args.token_split_budget,
                engine=args.engine,
                kv_transfer=args.kv_transfer,
                kv_arena_mib=args.kv_arena_mib,
                fluidtoken=mech.fluidtoken,
                adaptive=args.adaptive,
                force_steal=args.force_steal,
                log_level=args.log_level,
                sim=SimEngineArgs(args.noise, args.drift, args.seed + i),
                gpu=GpuEngineArgs(
                    args.gpu_model, devices[i % len(devices)], args.dtype, args.weight_seed
                )
                if args.engine == "gpu"
                else None,
                extra=(
                    ("--device", devices[i % len(devices)], *sglang_sidecar_args(args))
                    if args.engine == "sglang"
                    else ()
                ),
            )
            argv = ["sidecar", *sidecar.argv()]
            stack.start(wid, argv, env, worker_sockets[i])
            workers.append(f"{wid}=http://{args.host}:{port}")
        router = RouterCommand(
            args.host, router_port, model, pairing=args.pairing,
            first_token_timeout=args.first_token_timeout, log_level=args.log_level,
            workers=tuple(workers),
        )  # fmt: skip
        stack.start("router", ["router", *router.argv()], env, router_socket)
        endpoint = f"http://{args.host}:{router_port}"
        wait_s = args.ready_timeout
        if args.engine == "sglang":  # SGLang's start (minutes) has its own limit
            wait_s = max(wait_s, args.sglang_start_timeout)
        deadline = time.time() + wait_s
        # An sglang sidecar is healthy at once and ready when its SGLang server is.
        probe = "/readyz" if args.engine == "sglang" else "/healthz"
        pending = [f"{w.split('=', 1)[1]}{probe}" for w in workers] + [f"{endpoint}/healthz"]
        while pending and not stack.dead() and time.time() < deadline:
            # A second at a time, so that a process that exits (an SGLang that cannot start
            # ends its sidecar with one line) ends the wait at once, not at the deadline.
            if procs.wait_http(pending[0], min(1.0, max(0.0, deadline - time.time()))):
                pending.pop(0)
        if pending or stack.dead():
            raise UserError(stack.not_up(pending))
        if mech.fluidrole:
            # The workers' profile and the SLO: the predictive rule's capacity model.
            workers_profile = ModelRef(args.model, args.gpu, args.profile).argv()
            slo = ["--ttft-slo", str(args.ttft_slo), "--tpot-slo", str(args.tpot_slo)]
            ctl = ["controller", "--router", endpoint, *workers_profile, *slo]
            ctl += fluidrole_argv(args)
            ctl += ["--log-level", args.log_level]
            if args.controller_metrics_port:
                metrics_port = str(args.controller_metrics_port)
                ctl += ["--metrics-host", args.host, "--metrics-port", metrics_port]
            stack.start("controller", ctl, env)
        served = profile.model if args.profile else args.model
        consecutive = ports == list(range(ports[0], ports[0] + len(ports)))
        on = f"{ports[0]}-{ports[-1]}" if consecutive else ", ".join(map(str, ports))
        print(
            f"FluidPD is up: {endpoint} (OpenAI API; model {served})\n"
            f"  {args.pd} {args.policy}, sidecars on ports {on}, "
            f"logs in {run_dir}\n  admin token (Authorization: Bearer ...) in "
            f"{token_file}{'' if args.admin_token else f': {token}'}\n"
            "  Ctrl-C stops everything.",
            flush=True,
        )
        # For programs that start `up` (the drills' stack): the workers as the router's --worker
        # takes them, then the endpoint, whose file appearing means "up" (written whole).
        (run_dir / "workers").write_text("".join(f"{w}\n" for w in workers))
        (run_dir / "endpoint.tmp").write_text(endpoint + "\n")
        (run_dir / "endpoint.tmp").replace(run_dir / "endpoint")
        while not stopping:
            stack.report_exits()
            time.sleep(0.2)
    finally:
        stack.stop()
    print("stopped", flush=True)
    return 0
