"""kopf handlers: one level-based reconcile (create, update, resume, timer) and one control
daemon per FluidPDDeployment. Both go through the object's ``DeploymentController`` (kept in
kopf's per-object memo) under its lock, so they never race each other."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from prometheus_client import start_http_server

from fluidpd.controller.metrics import ControllerMetrics
from fluidpd_operator.config import OperatorConfig
from fluidpd_operator.deployment import DeploymentController
from fluidpd_operator.kube import Kube, load_config
from fluidpd_operator.resources import GROUP, PLURAL, VERSION

log = logging.getLogger("fluidpd.operator")
CONFIG = OperatorConfig.from_env()


def plain(value: Any) -> Any:
    """kopf's live body views as plain JSON-like dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's bookkeeping under our own domain, not kopf.zalando.org.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Our own Events say what happened; kopf's per-handler ones would only add noise.
    settings.posting.level = logging.WARNING
    settings.peering.name = CONFIG.peering
    settings.peering.mandatory = False  # no peering object: run standalone
    settings.watching.server_timeout = 120
    memo.kube = Kube(load_config())
    memo.session = aiohttp.ClientSession()
    memo.metrics = ControllerMetrics()
    memo.metrics_server = None
    if CONFIG.metrics_port:
        memo.metrics_server = start_http_server(CONFIG.metrics_port, registry=memo.metrics.registry)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.session.close()
    if memo.metrics_server is not None:
        memo.metrics_server[0].shutdown()


def _controller(memo: kopf.Memo, body: kopf.Body) -> DeploymentController:
    ctl: DeploymentController | None = memo.get("deployment")
    if ctl is None:
        ctl = DeploymentController(memo.kube, plain(body), memo.session, CONFIG, memo.metrics)
        memo.deployment = ctl
    else:
        ctl.update(plain(body))
    return ctl


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.resync_s, initial_delay=CONFIG.resync_s)
async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    ctl = _controller(memo, body)
    async with ctl.lock:
        await ctl.reconcile()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def control(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Polls the sidecars and acts every ``fluidRole.intervalSeconds``."""
    while not stopped:
        ctl = _controller(memo, body)
        try:
            await ctl.step()
        except Exception:  # one bad interval must not end the control of this deployment
            log.exception("%s/%s: control interval failed", ctl.namespace, ctl.name)
        await stopped.wait(ctl.spec.fluid_role.interval_seconds)
