"""``fluidpd sidecar``: run one worker sidecar (one process per worker)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluidpd.api.commands import ENGINES, SGLANG_PREFILL_WINDOW, TRANSFERS
from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    GPU_HELP,
    MODEL_HELP,
    PROFILE_HELP,
    SEED_HELP,
    add_float,
    add_gpu_engine_options,
    add_model_dir_option,
    add_service_options,
    check_cuda_ipc,
    check_gpu_devices,
    configure_logging,
    load_model_dir_option,
    mem_fraction,
    positive_float,
    positive_int,
    serve_http,
    steal_ratio,
)
from fluidpd.cli.policy_options import (
    add_fluidtoken_options,
    add_slo_options,
    fluidtoken_config,
    slo_config,
)
from fluidpd.core.types import Role
from fluidpd.profiles import resolve_profile

if TYPE_CHECKING:
    from fluidpd_sidecar.transfer_cuda_ipc import CudaIpcTransfer
    from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer
    from fluidpd_sidecar.transfer_shm import ShmTransfer


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sidecar",
        help="run one worker sidecar (engine + shared scheduler + HTTP API)",
        description="One process per worker: owns an engine, runs the shared FluidPD scheduler "
        "and serves the P/D protocol, /pressure, /role, health and Prometheus metrics.",
    )
    p.add_argument("--id", required=True, help="worker id, unique in the deployment")
    p.add_argument("--role", choices=[r.value for r in Role], required=True, help="initial role")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=positive_int, default=8100, help="port to listen on")
    p.add_argument(
        "--url", default=None, help="URL peers reach this sidecar at (default: http://HOST:PORT)"
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="sim",
        help="sim: steps timed by the profile; gpu: the torch transformer; sglang: an SGLang "
        "0.5.17 server supervised by the sidecar (its own venv: scripts/sglang/mkvenv.sh)",
    )
    p.add_argument(
        "--kv-transfer",
        choices=TRANSFERS,
        default="sim",
        help="KV hand-off: modelled time, real bytes over mooncake's TCP transport, real "
        "bytes through shared memory (one host), or GPU to GPU through CUDA IPC handles (one "
        "host; the arena is memory of --device)",
    )
    p.add_argument(
        "--kv-arena-mib",
        type=positive_int,
        default=1024,
        help="mooncake/shm: registered host memory for KV hand-offs, MiB (cuda-ipc: GPU memory)",
    )
    add_model_dir_option(p)
    add_gpu_engine_options(p)
    add_sglang_options(p)
    p.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument("--profile", default=None, help=PROFILE_HELP)
    add_slo_options(p)
    p.add_argument("--no-fluidtoken", action="store_true", help="disable token stealing")
    add_fluidtoken_options(p)
    p.add_argument("--adaptive", action="store_true", help="recalibrate predictors online")
    add_float(p, "--noise", 0.0, "sim engine: log-normal noise sigma", allow_zero=True)
    add_float(p, "--drift", 1.0, "sim engine: true time / profile prediction")
    p.add_argument("--seed", type=int, default=0, help=SEED_HELP + " (sim engine noise)")
    add_float(p, "--bootstrap-timeout", 300.0, "give up a prefill half never reserved after, s")
    p.add_argument(
        "--force-steal",
        type=steal_ratio,
        default=None,
        metavar="BETA",
        help="run every prompt with stealing ratio BETA in [0, 1] (the decode worker computes "
        "its last BETA share), whatever FluidToken decides (testing, pinning a split; default: "
        "FluidToken decides); the sglang engine's is changed at run time with PUT "
        "/admin/fluidtoken",
    )
    add_service_options(p, "warning")
    p.set_defaults(func=run)


def add_sglang_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sglang engine (--engine sglang; also --model-dir, --device)")
    g.add_argument(
        "--sglang-python",
        default=None,
        metavar="PATH",
        help="the interpreter of SGLang's venv (default: $FLUIDPD_SGLANG_PYTHON, else "
        "~/.cache/fluidpd/sglang-venv/bin/python as scripts/sglang/mkvenv.sh makes it)",
    )
    g.add_argument(
        "--mem-fraction",
        type=mem_fraction,
        default=None,
        help="SGLang's --mem-fraction-static (share of the GPU for weights and KV; default: "
        "SGLang's own)",
    )
    g.add_argument(
        "--sglang-max-total-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="SGLang's KV pool size in tokens (CPU servers need one; default: SGLang sizes it "
        "from --mem-fraction)",
    )
    g.add_argument(
        "--sglang-load-format",
        default=None,
        metavar="FORMAT",
        help="SGLang's --load-format (dummy: the model directory's config.json, random weights; "
        "default: SGLang's auto, the directory's weights, whose safetensors headers the sidecar "
        "checks before it starts SGLang)",
    )
    g.add_argument(
        "--sglang-dtype",
        choices=("auto", "float16", "bfloat16", "float32"),
        default=None,
        help="SGLang's --dtype (default: SGLang's auto, which runs a float32 checkpoint in "
        "float16)",
    )
    g.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more SGLang server flag (repeatable), e.g. --sglang-arg=--disable-cuda-graph "
        "(default: none)",
    )
    g.add_argument(
        "--sglang-prefill-window",
        type=positive_int,
        default=SGLANG_PREFILL_WINDOW,
        metavar="N",
        help="FluidToken on a prefill worker: at most N requests in SGLang at once; the next is "
        "released when SGLang's forward of the previous is done, while its KV is still in "
        "transfer (1: one request's whole call, compute and transfer, at a time)",
    )
    g.add_argument(
        "--sglang-prefill-batching",
        action="store_true",
        help="FluidToken on a prefill worker: hand SGLang a request left whole (nothing "
        "stolen) at once, so that SGLang batches a burst's forwards as its own P/D does, "
        "instead of after the previous forward (default: off; on an H100 it did not close "
        "the gap to SGLang's own P/D: results/sglang/h100-live-2026-12-07-batching)",
    )
    g.add_argument(
        "--sglang-start-timeout",
        type=positive_float,
        default=900.0,
        metavar="S",
        help="give up (and exit non-zero) when SGLang is not healthy after this long",
    )


def check_engine_options(args: argparse.Namespace) -> None:
    """Options that need another engine than the one chosen: a clear error, not an option
    taken and ignored (``sidecar`` and ``up``)."""
    if args.engine == "gpu" and args.kv_transfer == "sim":
        raise UserError(
            "--kv-transfer: the gpu engine hands off real KV; use shm, mooncake or cuda-ipc"
        )
    if args.sglang_prefill_batching and args.engine != "sglang":
        raise UserError("--sglang-prefill-batching: only with --engine sglang")


def sglang_sidecar_args(args: argparse.Namespace) -> list[str]:
    """The ``add_sglang_options`` flags of a parsed command line, for a sidecar's (``up``)."""
    out: list[str] = ["--sglang-start-timeout", str(args.sglang_start_timeout)]
    out += ["--sglang-prefill-window", str(args.sglang_prefill_window)]
    if args.sglang_prefill_batching:
        out.append("--sglang-prefill-batching")
    if args.sglang_python:
        out += ["--sglang-python", args.sglang_python]
    if args.mem_fraction is not None:
        out += ["--mem-fraction", str(args.mem_fraction)]
    if args.sglang_max_total_tokens is not None:
        out += ["--sglang-max-total-tokens", str(args.sglang_max_total_tokens)]
    if args.sglang_load_format:
        out += ["--sglang-load-format", args.sglang_load_format]
    if args.sglang_dtype:
        out += ["--sglang-dtype", args.sglang_dtype]
    return out + [f"--sglang-arg={a}" for a in args.sglang_arg]


def run(args: argparse.Namespace) -> int:

    from fluidpd.modeldir.model_dir import ModelDirError
    from fluidpd.modeldir.text import TokenText
    from fluidpd_sidecar.app import create_app
    from fluidpd_sidecar.engine import Engine, SimEngine
    from fluidpd_sidecar.service import SidecarConfig, SidecarService
    from fluidpd_sidecar.transfer import KVTransfer, SimTransfer

    check_engine_options(args)
    profile = resolve_profile(args.model, args.gpu, args.profile)
    model = load_model_dir_option(args)
    try:
        text = TokenText.from_model_dir(model)
    except ModelDirError as exc:
        raise UserError(f"--model-dir: {exc}") from None
    slo = slo_config(args)
    token_cfg = fluidtoken_config(args, enabled=not args.no_fluidtoken)
    url = args.url or f"http://{args.host}:{args.port}"
    cfg = SidecarConfig(
        worker_id=args.id,
        role=Role(args.role),
        url=url,
        profile=profile,
        slo=slo,
        model=model,
        token_cfg=token_cfg,
        adaptive=args.adaptive,
        admin_token=args.admin_token or None,
        bootstrap_timeout_s=args.bootstrap_timeout,
        force_steal=args.force_steal,
    )
    if args.engine == "sglang":
        return _run_sglang(args, cfg, text)
    if args.engine == "gpu":
        check_gpu_devices([args.device])  # before a KV arena is made
    transfer: KVTransfer
    staging: ShmTransfer | MooncakeTransfer | CudaIpcTransfer | None = None
    if args.kv_transfer == "cuda-ipc":
        check_cuda_ipc([args.device])
        from fluidpd_sidecar.transfer_cuda_ipc import CudaIpcTransfer

        staging = CudaIpcTransfer(arena_bytes=args.kv_arena_mib << 20, device=args.device)
        transfer = staging
    elif args.kv_transfer == "mooncake":
        from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer

        staging = MooncakeTransfer(hostname=args.host, arena_bytes=args.kv_arena_mib << 20)
        transfer = staging
    elif args.kv_transfer == "shm":
        from fluidpd_sidecar.transfer_shm import ShmTransfer

        staging = ShmTransfer(arena_bytes=args.kv_arena_mib << 20)
        transfer = staging
    else:
        transfer = SimTransfer(profile.transfer_model())
    engine: Engine
    if args.engine == "gpu":
        from fluidpd_sidecar.gpu.factory import build_engine

        try:
            engine = build_engine(
                args.gpu_model,
                profile,
                Role(args.role),
                model_dir=args.model_dir,
                device=args.device,
                dtype=args.dtype,
                seed=args.weight_seed,
                staging=staging,
                text_ids=None if args.model_dir else text.text_ids(),
            )
        except (ValueError, FileNotFoundError) as exc:
            if staging is not None:
                staging.close()
            raise UserError(
                f"{'--model-dir' if args.model_dir else '--engine-model'}: {exc}"
            ) from None
    else:
        engine = SimEngine(
            profile, text.text_ids(), args.noise, args.drift, args.seed, staging=staging
        )
    need = engine.kv_wire_bytes(profile.context_limit)
    if staging is not None and need > staging.arena_bytes:
        # A prompt at the context limit could never be handed off (its reservation would wait
        # for room that never comes): refuse now rather than stall the queue behind it.
        staging.close()
        raise UserError(
            f"--kv-arena-mib: {args.kv_arena_mib} MiB cannot hold the KV of one request at the "
            f"context limit ({profile.context_limit} tokens = {need / 2**20:.0f} MiB)"
        )
    configure_logging(args.log_level, args.id)
    service = SidecarService(cfg, engine, transfer, text)
    serve_http(create_app(service), args)
    return 0


#: SGLang load formats that read the directory's ``*.safetensors`` (None: SGLang's default, auto).
SAFETENSORS_LOAD_FORMATS = (None, "auto", "safetensors")


def _check_sglang_weights(args: argparse.Namespace) -> None:
    """The weights SGLang will load, checked from their headers (milliseconds) before SGLang is
    spawned: its loader reports a truncated or missing file only after a minute or more of
    starting. Skipped when it reads no safetensors (``--sglang-load-format dummy``: random
    weights; other formats read other files)."""
    from fluidpd.modeldir.model_dir import ModelDirError
    from fluidpd.modeldir.weights import check_weights, has_safetensors

    if args.sglang_load_format not in SAFETENSORS_LOAD_FORMATS:
        return
    root = Path(args.model_dir).expanduser()
    pytorch_only = not has_safetensors(root) and any(
        f.suffix in (".bin", ".pt") for f in root.iterdir() if f.is_file()
    )
    if args.sglang_load_format != "safetensors" and pytorch_only:
        return  # SGLang's "auto" loads PyTorch checkpoints then; it checks them itself
    try:
        check_weights(args.model_dir)
    except ModelDirError as exc:
        raise UserError(f"--model-dir: {exc}") from None


def _run_sglang(args: argparse.Namespace, cfg: Any, text: Any) -> int:
    """The sidecar of an SGLang worker: SGLang's own P/D (KV over its Mooncake backend)."""
    import logging
    import os
    import signal
    import sys
    from pathlib import Path
    from urllib.parse import urlparse

    from fluidpd_sidecar.sglang.app import create_app as create_sglang_app
    from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports
    from fluidpd_sidecar.sglang.service import SglangService

    if not args.model_dir:
        raise UserError("--model-dir: the sglang engine serves a model directory; give one")
    _check_sglang_weights(args)
    python = (
        args.sglang_python
        or os.environ.get("FLUIDPD_SGLANG_PYTHON")
        or str(Path.home() / ".cache/fluidpd/sglang-venv/bin/python")
    )
    if not os.access(python, os.X_OK):
        raise UserError(
            f"--sglang-python: {python} is not an executable; make SGLang's venv with "
            "sh scripts/sglang/mkvenv.sh"
        )
    if args.device != "cpu":
        check_gpu_devices([args.device])
    port, hook_port, bootstrap_port = free_ports(3)
    role = Role(args.role)
    server = SglangServer(
        SglangConfig(
            python=python,
            model_dir=Path(args.model_dir),
            port=port,
            hook_port=hook_port,
            device=args.device,
            mem_fraction=args.mem_fraction,
            mode=role.value,
            # Every worker can become a prefill in place (FluidRole): a bootstrap port each.
            bootstrap_port=bootstrap_port,
            fluidrole=True,
            transfer_backend="mooncake",
            load_format=args.sglang_load_format,
            dtype=args.sglang_dtype,
            max_total_tokens=args.sglang_max_total_tokens,
            # FluidToken's suffix extend is wired into SGLang's non-overlap decode loop, and any
            # worker may become a decode worker in place (FluidRole).
            extra_args=(
                ("--disable-overlap-schedule",)
                if not args.no_fluidtoken or args.force_steal is not None
                else ()
            )
            + tuple(args.sglang_arg),
            # Its bootstrap server and transfers must be reachable from peers' SGLang servers.
            host=urlparse(cfg.url).hostname or args.host,
            log_path=Path(os.environ.get("FLUIDPD_LOG_DIR", ".")) / f"sglang-{args.id}.log",
            start_timeout_s=args.sglang_start_timeout,
        )
    )
    configure_logging(args.log_level, args.id)
    service = SglangService(
        cfg,
        server,
        text,
        prefill_window=args.sglang_prefill_window,
        prefill_batching=args.sglang_prefill_batching,
    )
    # uvicorn re-raises the SIGTERM it shut down on once it returns. The service sends itself
    # one when SGLang cannot start or dies for good, and then the user must see why (the one
    # line below, exit 2), not a bare death by signal; a pod's SIGTERM still shuts down cleanly.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        serve_http(create_sglang_app(service), args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if service.failed:
        # Everything is stopped by now (SGLang gone, service and HTTP server shut down), so end
        # the process here rather than in interpreter shutdown: once, under load, a sidecar
        # printed this line and then did not exit for ten minutes, keeping a failed pod alive.
        print(f"fluidpd: error: sglang: {service.failed}", file=sys.stderr, flush=True)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(2)
    return 0
