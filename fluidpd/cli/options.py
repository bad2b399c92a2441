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
from typing import Any

from fluidpd.cli.errors import UserError


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
        help="bearer token on internal and admin endpoints (env FLUIDPD_ADMIN_TOKEN)",
    )
    parser.add_argument("--log-level", default=log_level, help=f"(default {log_level})")


def configure_logging(log_level: str, tag: str) -> None:
    """One log format for every FluidPD process, tagged with who is speaking."""
    logging.basicConfig(
        level=log_level.upper(), format=f"%(asctime)s {tag} %(levelname)s %(message)s"
    )


def serve_http(app: Any, args: argparse.Namespace) -> None:
    """Serve an ASGI app the way every FluidPD HTTP process does (uvloop, httptools, no access
    log: the request path is the hot path)."""
    import uvicorn

    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


def add_gpu_engine_options(parser: argparse.ArgumentParser) -> None:
    """The ``gpu`` engine's model options (shared by ``sidecar``, ``up`` and ``profile``)."""
    g = parser.add_argument_group("gpu engine")
    g.add_argument(
        "--gpu-model",
        default="llama-3.1-8b",
        help="model shape: llama-3.1-8b, llama-3.2-1b, qwen3-8b, qwen3-0.6b, tiny-llama, "
        "tiny-qwen3, or a Hugging Face config.json (or its directory)",
    )
    g.add_argument(
        "--weights", default=None, help="local safetensors directory (default: seeded weights)"
    )
    g.add_argument("--weight-seed", type=int, default=0, help="seed of the generated weights")
    g.add_argument("--device", default="cuda", help="torch device (cuda, cuda:1, cpu)")
    g.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")


def check_gpu_devices(devices: list[str]) -> None:
    """Each ``--device`` usable by the gpu engine, or one line naming the bad one (imports torch:
    call only when the gpu engine is asked for)."""
    from fluidpd_sidecar.gpu.device import check_device

    for text in devices:
        try:
            check_device(text)
        except ValueError as exc:
            raise UserError(f"--device: {exc}") from None
