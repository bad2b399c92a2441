"""Option parsers shared by subcommands; each raises a one-line error naming the option.

The parsers raise ``argparse.ArgumentTypeError``: argparse prefixes the option's name and keeps
the message, where any other error (``UserError`` is a ``ValueError``) becomes a bare
"invalid parse value" that hides the reason.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fluidpd import listeners
from fluidpd.cli.errors import UserError
from fluidpd.profiles import available_profiles
from fluidpd_sidecar.gpu.config import SHAPES  # no torch: the shapes' published numbers only

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


#: --model / --gpu / --profile pick the profile the predictors (and the sim engine) use.
MODEL_HELP = (
    "model of the profile: --model M --gpu G reads profiles/M-G.yaml (shipped: "
    + (", ".join(available_profiles()) or "none")
    + "; `fluidpd profiles` lists them)"
)
GPU_HELP = (
    "GPU type of the profile, e.g. a100-80gb or h200 (a name in the profile's file name, not "
    "a device: the gpu engine's device is --device)"
)
PROFILE_HELP = (
    "profile YAML file (replaces --model/--gpu; default: <model>-<gpu>.yaml from the shipped "
    "profiles, or from $FLUIDPD_PROFILES_DIR when set)"
)
SEED_HELP = "random seed; the same seed gives the same run"

if TYPE_CHECKING:
    from fluidpd.modeldir.model_dir import ModelDir


def _number(text: str, kind: type[float] | type[int], *, allow_zero: bool) -> float:
    noun = "an integer" if kind is int else "a number"
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "positive"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    return float(_number(text, float, allow_zero=False))


def non_negative_float(text: str) -> float:
    return float(_number(text, float, allow_zero=True))


def positive_int(text: str) -> int:
    return int(_number(text, int, allow_zero=False))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, allow_zero=True))


def mem_fraction(text: str) -> float:
    """A share of the GPU's memory, in (0, 1] (SGLang's --mem-fraction-static)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0-65535 (0: any free port, where an option allows it)."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port (0-65535), got {text!r}")
    return value


def steal_ratio(text: str) -> float:
    """A stealing ratio beta in [0, 1]."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def float_list(text: str) -> list[float]:
    """Comma-separated positive numbers, duplicates dropped (e.g. ``--rps 10,20,30``)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected a comma-separated list of numbers")
    return list(dict.fromkeys(positive_float(p) for p in parts))


def add_float(
    group: argparse._ArgumentGroup | argparse.ArgumentParser,
    flag: str,
    default: float,
    help_text: str,
    *,
    allow_zero: bool = False,
) -> None:
    parse = non_negative_float if allow_zero else positive_float
    group.add_argument(flag, type=parse, default=default, help=f"{help_text} (default {default})")


def add_service_options(parser: argparse.ArgumentParser, log_level: str = "warning") -> None:
    """What every long-running FluidPD process takes: the shared bearer token and a log level."""
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("FLUIDPD_ADMIN_TOKEN"),
        # "default" in the text keeps the formatter from printing the value: a token from the
        # environment must not show in --help.
        help="bearer token on internal and admin endpoints (default: $FLUIDPD_ADMIN_TOKEN; "
        "without one they are open)",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=log_level,
        help="log level of this process",
    )


def configure_logging(log_level: str, tag: str) -> None:
    """One log format for every FluidPD process, tagged with who is speaking."""
    logging.basicConfig(
        level=log_level.upper(), format=f"%(asctime)s {tag} %(levelname)s %(message)s"
    )
    # Diagnostic traces without a process-wide --log-level debug: FLUIDPD_DEBUG_LOGGERS names
    # loggers (comma-separated, e.g. fluidpd.trace) that log at DEBUG whatever the level is.
    for name in os.environ.get("FLUIDPD_DEBUG_LOGGERS", "").split(","):
        if name.strip():
            logging.getLogger(name.strip()).setLevel(logging.DEBUG)


def serve_http(app: Any, args: argparse.Namespace) -> None:
    """Serve an ASGI app the way every FluidPD HTTP process does (uvloop, httptools, no access
    log: the request path is the hot path), on the listening socket a launcher handed over
    (``fluidpd up``) or else on ``--host``/``--port``."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        # Longer than any FluidPD client keeps an idle connection (the router's pool: 30 s), so
        # the client, not the server, closes it: a request sent on a connection the server is
        # closing fails with "Server disconnected" (uvicorn's default is 5 s).
        timeout_keep_alive=75,
    )
    sock = listeners.inherited()
    server = uvicorn.Server(config)
    server.run(sockets=None if sock is None else [sock])
    if not server.started:  # as uvicorn.run: a server that could not start is a failed process
        sys.exit(3)


def add_model_dir_option(parser: argparse.ArgumentParser) -> None:
    """``--model-dir``: the Hugging Face model directory served (router, sidecars, profile)."""
    parser.add_argument(
        "--model-dir",
        default=None,
        metavar="DIR",
        help="local Hugging Face model directory (config.json, generation_config.json, "
        "tokenizer.json, tokenizer_config.json with the chat template, *.safetensors); "
        "default: the embedded tokenizer, for the sim engine",
    )


def load_model_dir_option(args: argparse.Namespace) -> ModelDir:
    """The ``--model-dir`` given (or the embedded default), checked; one line if it is bad."""
    from fluidpd.modeldir.embedded import resolve_model_dir
    from fluidpd.modeldir.model_dir import ModelDirError

    try:
        return resolve_model_dir(args.model_dir)
    except ModelDirError as exc:
        raise UserError(f"--model-dir: {exc}") from None


class _DeprecatedSpelling(argparse.Action):
    """An option's old spelling: still works, and says once on stderr what replaced it."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"fluidpd: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_gpu_engine_options(parser: argparse.ArgumentParser) -> None:
    """The ``gpu`` engine's model options (shared by ``sidecar``, ``up`` and ``profile``)."""
    g = parser.add_argument_group("gpu engine (--engine gpu)")
    g.add_argument(
        "--engine-model",
        dest="gpu_model",
        default="llama-3.1-8b",
        metavar="SHAPE",
        help="the model the gpu engine runs without --model-dir, with seeded random weights "
        "(benchmarks): "
        + ", ".join(SHAPES)
        + ", or a Hugging Face config.json (or its directory); with --model-dir the directory's "
        "config.json and safetensors weights are served instead. Not the profile (--model/--gpu). "
        "Was --gpu-model, which still works but is deprecated",
    )
    g.add_argument(
        "--gpu-model",
        dest="gpu_model",
        action=_DeprecatedSpelling,
        new="--engine-model",
        help=argparse.SUPPRESS,
    )
    g.add_argument(
        "--weight-seed",
        type=int,
        default=0,
        help="seed of the seeded weights, identical in every process with the same seed "
        "(no --model-dir)",
    )
    g.add_argument(
        "--device",
        default="cuda",
        help="torch device: cuda, cuda:N or cpu",
    )
    g.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="weights and KV cache dtype",
    )


def check_cuda_ipc(devices: list[str]) -> None:
    """``--kv-transfer cuda-ipc``: every device a CUDA device torch can use, or one line saying
    why not (imports torch: call only when that transport is asked for)."""
    try:
        from fluidpd_sidecar.transfer_cuda_ipc import CudaIpcUnavailableError, cuda_device
    except ImportError as exc:
        raise UserError(f"--kv-transfer cuda-ipc needs a CUDA device; torch: {exc}") from None
    for text in devices:
        try:
            cuda_device(text)
        except CudaIpcUnavailableError as exc:
            raise UserError(str(exc)) from None


def check_gpu_devices(devices: list[str]) -> None:
    """Each ``--device`` usable by the gpu engine, or one line naming the bad one (imports torch:
    call only when the gpu engine is asked for)."""
    from fluidpd_sidecar.gpu.device import check_device

    for text in devices:
        try:
            check_device(text)
        except ValueError as exc:
            raise UserError(f"--device: {exc}") from None
