"""One FluidPDDeployment's controller: children, role switches, scale in/out, status.

Everything it needs to pick up after a restart lives in the cluster: a switch in progress is the
pod's ``fluidpd.io/desired-role`` annotation (written *before* the sidecar is asked to switch),
a scale-in is the ``fluidpd.io/retire`` annotation (written before the sidecar is asked to
drain), and the fallback's extra workers are ``status.autoscaledWorkers``. The decisions are the
core's (``FluidRolePolicy`` through ``FluidRoleController``, ``CapacityFallback``); this package
carries them out with the API server and the sidecars.

The controller is cut by concern, one module each (as crate-operator's ``handlers/``):
``pods`` (pure pod helpers), ``state`` (what it holds), ``scale`` (pods and scale, the
fallback), ``switches``, ``routers`` (router sync) and ``status``; the kopf handlers that drive
it are in ``fluidpd_operator.handlers``.
"""

from __future__ import annotations

from fluidpd_operator.deployment.pods import (
    PodView,
    next_names,
    pod_ready,
    pod_role,
    roles_for_new_pods,
    why_not_ready,
)
from fluidpd_operator.deployment.routers import ROUTER_RESYNC_S, RouterSync
from fluidpd_operator.deployment.scale import PodsAndScale
from fluidpd_operator.deployment.status import StatusWriter
from fluidpd_operator.deployment.switches import Switches

__all__ = [
    "ROUTER_RESYNC_S",
    "DeploymentController",
    "PodView",
    "next_names",
    "pod_ready",
    "pod_role",
    "roles_for_new_pods",
    "why_not_ready",
]


class DeploymentController(PodsAndScale, Switches, RouterSync, StatusWriter):
    """Owns one FluidPDDeployment. ``reconcile`` converges its children to the spec;
    ``step`` is one control interval (pressure, switches, fallback, scale-in, router, status)."""

    async def step(self) -> None:
        async with self.lock:
            self._errors = [e for e in self._errors if e.startswith("auth")]
            if self.token is None:
                await self.ensure_token()
            await self.refresh_pods()
            await self.load_profile()
            ctl = self._controller()
            ctl.headers = self.headers
            decision = await ctl.step()
            await self._resume_switches(ctl)
            await self._handle_events(ctl)
            await self.finish_retirements()
            await self._fallback(ctl, decision)
            await self.refresh_pods()
            await self.converge_pods()
            await self.sync_routers()
            await self.write_status(ctl)
