"""Option parsers shared by subcommands; each raises a one-line error naming the option."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable
from typing import Any

from fluidpd.cli.errors import UserError


def _float(name: str, allow_zero: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"{name}: expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "a positive number"
            raise UserError(f"{name}: must be {bound}, got {text!r}")
        return value

    return parse


def positive_float(name: str) -> Callable[[str], float]:
    return _float(name, allow_zero=False)


def non_negative_float(name: str) -> Callable[[str], float]:
    return _float(name, allow_zero=True)


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UserError(f"{name}: expected an integer, got {text!r}") from None
        if value <= 0:
            raise UserError(f"{name}: must be a positive integer, got {text!r}")
        return value

    return parse


def float_list(name: str) -> Callable[[str], list[float]]:
    one = positive_float(name)

    def parse(text: str) -> list[float]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise UserError(f"{name}: expected a comma-separated list of numbers")
        return list(dict.fromkeys(one(p) for p in parts))

    return parse


def add_float(
    group: argparse._ArgumentGroup | argparse.ArgumentParser,
    flag: str,
    default: float,
    help_text: str,
    *,
    allow_zero: bool = False,
) -> None:
    parse = non_negative_float(flag) if allow_zero else positive_float(flag)
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
