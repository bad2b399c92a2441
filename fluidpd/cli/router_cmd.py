"""``fluidpd router``: the OpenAI-compatible front door."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    GPU_HELP,
    add_float,
    add_model_dir_option,
    add_service_options,
    configure_logging,
    load_model_dir_option,
    positive_int,
    serve_http,
)
from fluidpd.core.pairing import PAIRINGS
from fluidpd.profiles import resolve_profile


def parse_workers(items: list[str]) -> dict[str, str]:
    workers: dict[str, str] = {}
    for item in items:
        wid, sep, url = item.partition("=")
        if not sep or not wid or not url.startswith(("http://", "https://")):
            raise UserError(f"--worker: expected ID=http://HOST:PORT, got {item!r}")
        if wid in workers:
            raise UserError(f"--worker: {wid!r} given twice")
        workers[wid] = url.rstrip("/")
    return workers


def add_parser(sub: Any) -> None:
    p = sub.add_parser("router", help="run the OpenAI-compatible router")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=positive_int, default=8000, help="port to listen on")
    p.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="ID=URL",
        help="a worker sidecar (repeat); more can be PUT to /admin/workers later (default: "
        "none until then)",
    )
    p.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="served model name, and with --gpu the profile (for the context limit)",
    )
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument(
        "--profile",
        default=None,
        help="profile YAML (for the context limit; default: <model>-<gpu>.yaml as for the "
        "other commands)",
    )
    add_model_dir_option(p)
    p.add_argument(
        "--pairing",
        choices=PAIRINGS,
        default="round-robin",
        help="how a prefill worker is paired with a decode worker: round-robin, or "
        "least-loaded (the shortest prefill queue and the most free decode KV, each as last "
        "polled less what was routed there since; ties in turn), or random (as SGLang's mini_lb)",
    )
    add_float(p, "--first-token-timeout", 60.0, "cancel a request without a first token after, s")
    add_float(p, "--poll", 0.5, "worker poll period, s")
    add_service_options(p, "warning")
    p.set_defaults(func=run)


def keep_torch_out() -> None:
    """The router only tokenizes, but ``transformers`` imports torch whenever it is installed
    (its GGUF loader, at import): 4.7 of the 6.5 CPU-seconds of a router's start, measured on
    a 2-core machine. ``None`` in ``sys.modules`` is Python's own way to make a module
    unimportable; ``transformers`` then loads its tokenizers only (the same ids), and its
    advisory line that models are unavailable is not wanted in the router's log. Called for
    a router process only (``main.process_main``): a program that imports torch itself must
    not lose it."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def run(args: argparse.Namespace) -> int:
    from fluidpd.modeldir.model_dir import ModelDirError
    from fluidpd.router.app import RouterConfig, create_app
    from fluidpd.router.prompts import Prompter

    profile = resolve_profile(args.model, args.gpu, args.profile)
    model = load_model_dir_option(args)
    try:
        prompter = Prompter(model)
    except ModelDirError as exc:
        raise UserError(f"--model-dir: {exc}") from None
    cfg = RouterConfig(
        model=args.model if args.profile is None else profile.model,
        context_limit=model.context_limit(profile.context_limit),
        workers=parse_workers(args.worker),
        admin_token=args.admin_token or None,
        pairing=args.pairing,
        first_token_timeout_s=args.first_token_timeout,
        poll_s=args.poll,
    )
    configure_logging(args.log_level, "router")
    serve_http(create_app(cfg, prompter), args)
    return 0
