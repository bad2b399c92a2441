"""``fluidpd operator``: the Kubernetes operator (kopf) for FluidPDDeployment objects."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import LOG_LEVELS, positive_int


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator for FluidPDDeployment objects",
        description="Reconciles FluidPDDeployments into worker pods, per-role Services and a "
        "router, switches workers' roles in place with the FluidRole policy and adds or removes "
        "workers when both phases stay pressured. Credentials: in-cluster, else the kubeconfig. "
        "Settings also come from FLUIDPD_* environment variables (see the Helm chart).",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeat; default: all namespaces)",
    )
    p.add_argument("--peering", default=None, help="kopf peering object (default fluidpd)")
    p.add_argument("--standalone", action="store_true", help="ignore peering (one operator)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (highest leads)")
    p.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz (default: not served)",
    )
    p.add_argument(
        "--metrics-port",
        type=positive_int,
        default=None,
        help="serve the controllers' Prometheus metrics on this port (default: off)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=None,
        help="log level (default info; env FLUIDPD_LOG_LEVEL)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import kopf  # noqa: F401
    except ImportError:
        raise UserError("the operator needs kopf: pip install 'fluidpd[k8s]'") from None
    # Flags win over the environment; the handlers read their settings from it at import.
    if args.peering:
        os.environ["FLUIDPD_PEERING"] = args.peering
    if args.metrics_port:
        os.environ["FLUIDPD_METRICS_PORT"] = str(args.metrics_port)
    if args.log_level:
        os.environ["FLUIDPD_LOG_LEVEL"] = args.log_level
    if args.liveness and not args.liveness.startswith(("http://", "https://")):
        raise UserError(
            f"--liveness: expected a URL like http://0.0.0.0:8080/healthz, got {args.liveness!r}"
        )
    from fluidpd_operator.main import run as run_operator

    return run_operator(args.namespace, args.standalone, args.priority, args.liveness)
