"""``fluidpd controller``: the FluidRole controller, without Kubernetes."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import TYPE_CHECKING, Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    GPU_HELP,
    MODEL_HELP,
    PROFILE_HELP,
    add_service_options,
    configure_logging,
    positive_int,
)
from fluidpd.cli.policy_options import (
    add_fluidrole_options,
    add_slo_options,
    fluidrole_config,
    slo_config,
)
from fluidpd.cli.router_cmd import parse_workers
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile

if TYPE_CHECKING:
    from fluidpd.controller.metrics import DeploymentMetrics


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "controller",
        help="run the FluidRole controller against running sidecars",
        description="Polls each sidecar's /pressure, runs the FluidRole policy and switches "
        "workers in place with POST /role. Workers come from --router (its worker set) or "
        "--worker. The predictive switch rule (the default) forecasts from the router's "
        "arrivals (GET /admin/arrivals), the workers' profile (--model/--gpu or --profile) and "
        "the SLO, as the simulator does; without --router it decides as the paper rule.",
    )
    p.add_argument(
        "--router",
        default=None,
        help="router URL; its worker set is used (default: none, only --worker)",
    )
    p.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="ID=URL",
        help="a worker sidecar to control (repeat; instead of or besides --router; default: none)",
    )
    p.add_argument(
        "--metrics-port",
        type=positive_int,
        default=None,
        help="serve the controller's Prometheus metrics on this port (/metrics; default: off)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    p.add_argument(
        "--deployment",
        default="local/fluidpd",
        metavar="NAMESPACE/NAME",
        help="the deployment the metrics are labelled with (default local/fluidpd)",
    )
    p.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument("--profile", default=None, help=PROFILE_HELP)
    add_slo_options(p)
    add_fluidrole_options(p)
    add_service_options(p, "info")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.router and not args.worker:
        raise UserError("give --router or at least one --worker")
    static = parse_workers(args.worker)
    cfg = fluidrole_config(args)
    slo = slo_config(args)
    profile = resolve_profile(args.model, args.gpu, args.profile)
    configure_logging(args.log_level, "controller")
    namespace, _, name = args.deployment.partition("/")
    if not namespace or not name:
        raise UserError(f"--deployment: expected NAMESPACE/NAME, got {args.deployment!r}")
    metrics = None
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        from fluidpd.controller.metrics import ControllerMetrics

        registry = ControllerMetrics()
        metrics = registry.for_deployment(namespace, name)
        start_http_server(args.metrics_port, args.metrics_host, registry=registry.registry)
    asyncio.run(_main(args.router, static, cfg, args.admin_token or None, metrics, profile, slo))
    return 0


async def _main(
    router: str | None,
    static: dict[str, str],
    cfg: FluidRoleConfig,
    token: str | None,
    metrics: DeploymentMetrics | None = None,
    profile: Profile | None = None,
    slo: SLO | None = None,
) -> None:
    import aiohttp
    import orjson

    from fluidpd.controller.demand import DemandFeed
    from fluidpd.controller.loop import FluidRoleController

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:

        async def source() -> dict[str, str]:
            if not router:
                return static
            async with session.get(f"{router}/admin/stats", headers=headers) as resp:
                stats = orjson.loads(await resp.read())
            return {w["worker"]: w["url"] for w in stats["workers"]} | static

        async def refresh() -> None:
            if router:
                async with session.post(f"{router}/admin/poll", headers=headers):
                    pass

        demand = DemandFeed(session, router, headers) if router else None
        controller = FluidRoleController(
            source, cfg, session, token, refresh, metrics, profile=profile, slo=slo, demand=demand
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await controller.run(stop)
