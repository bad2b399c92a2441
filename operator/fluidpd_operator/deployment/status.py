"""Status: per-pod roles and pressure, pool pressure, the recommendation and the conditions
(Ready, Progressing, Degraded, CapacityExhausted), written only when they change."""

from __future__ import annotations

from typing import Any

from fluidpd.controller.loop import FluidRoleController
from fluidpd.core.fluidrole import Recommendation
from fluidpd.core.types import Role, RoleState
from fluidpd_operator import resources as res
from fluidpd_operator.deployment.pods import (
    annotation,
    meta,
    pod_ready,
    pod_role,
    rfc3339,
    why_not_ready,
)
from fluidpd_operator.deployment.state import DeploymentState
from fluidpd_operator.kube import KubeError


class StatusWriter(DeploymentState):
    def _condition(self, type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
        value = "True" if status else "False"
        old = self._conditions.get(type_)
        since = old["lastTransitionTime"] if old and old.get("status") == value else rfc3339()
        cond = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
        self._conditions[type_] = cond
        return cond

    def build_status(self, ctl: FluidRoleController) -> dict[str, Any]:
        v = self.view
        reports = ctl.reports
        pods = []
        counts = {Role.PREFILL: 0, Role.DECODE: 0}
        ready = 0
        for p in sorted(v.live, key=lambda p: meta(p)["name"]):
            name = meta(p)["name"]
            r = reports.get(name)
            role = pod_role(p)
            is_ready = pod_ready(p)
            ready += is_ready
            state = (r or {}).get("state") or ("pending" if not is_ready else "unknown")
            if annotation(p, res.RETIRE):
                state = "retiring"
            elif role is not None and is_ready and state == RoleState.ACTIVE.value:
                counts[role] += 1
            entry: dict[str, Any] = {
                "name": name,
                "role": role.value if role else "",
                "state": state,
                "ready": is_ready,
            }
            if r is not None:
                entry |= {
                    "ppi": round(float(r.get("attributable_ppi", 0.0)), 3),
                    "dpiLoad": round(float(r.get("dpi_load", 0.0)), 3),
                    "dpiAdm": round(float(r.get("dpi_adm", 0.0)), 3),
                }
            pods.append(entry)
        pressure = ctl.policy.last_pressure
        switching = ctl.in_flight
        target = self.target_workers
        rec = ctl.policy.last_recommendation
        exhausted = rec is Recommendation.NEEDS_CAPACITY and (
            not self.spec.autoscaling.enabled or target >= self.spec.autoscaling.max_workers
        )
        unreachable = [e["name"] for e in pods if e["ready"] and e["name"] not in reports]
        live = {meta(p)["name"]: p for p in v.live}
        not_ready = [
            f"{e['name']} ({why})" if (why := why_not_ready(live[e["name"]])) else e["name"]
            for e in pods
            if not e["ready"]
        ]
        routers = self.routers_ready
        is_ready = (
            ready >= target
            and counts[Role.PREFILL] >= self.spec.min_prefill
            and counts[Role.DECODE] >= self.spec.min_decode
            and routers > 0
        )
        if switching:
            progressing = (True, "SwitchInProgress", f"{switching[0]} -> {switching[1].value}")
        elif len(v.serving) < target:
            progressing = (True, "ScalingOut", f"{len(v.serving)}/{target} workers")
        elif v.retiring or len(v.serving) > target:
            progressing = (True, "ScalingIn", f"{len(v.retiring)} draining for removal")
        else:
            progressing = (False, "Stable", "no switch or scaling under way")
        degraded_msgs = [*self._errors]
        if unreachable:
            degraded_msgs.append(f"sidecars not answering: {', '.join(unreachable)}")
        if not_ready and not progressing[0]:
            degraded_msgs.append(f"workers not ready: {', '.join(not_ready)}")
        status: dict[str, Any] = {
            "observedGeneration": meta(self.body).get("generation"),
            "workers": len(v.live),
            "readyWorkers": ready,
            "ready": f"{ready}/{target}",
            "selector": res.selector_string(res.worker_selector(self.name)),
            "prefill": counts[Role.PREFILL],
            "decode": counts[Role.DECODE],
            "ppi": round(pressure.ppi_bar, 3),
            "dpi": round(pressure.dpi_load_bar, 3),
            "dpiAdm": round(pressure.dpi_adm_bar, 3),
            "autoscaledWorkers": self.autoscaled,
            "recommendation": rec.value,
            "routerEndpoint": (
                f"http://{self.name}-router.{self.namespace}.svc:{self.spec.router.port}"
            ),
            "pods": pods,
            "conditions": [
                self._condition(
                    "Ready",
                    is_ready,
                    "AllWorkersReady" if is_ready else "WorkersNotReady",
                    f"{ready}/{target} workers ready, {routers} router(s) ready",
                ),
                self._condition("Progressing", *progressing),
                self._condition(
                    "Degraded",
                    bool(degraded_msgs),
                    "Unhealthy" if degraded_msgs else "Healthy",
                    "; ".join(degraded_msgs) or "all workers answer",
                ),
                self._condition(
                    "CapacityExhausted",
                    exhausted,
                    "NeedsCapacity" if exhausted else "CapacityAvailable",
                    "both phases pressured and no room to add a worker"
                    if exhausted
                    else "FluidRole or the fallback can absorb the load",
                ),
            ],
        }
        if self.last_switch:
            status["lastSwitch"] = self.last_switch
        return status

    async def write_status(self, ctl: FluidRoleController) -> None:
        status = self.build_status(ctl)
        if status == self._last_status:
            return
        try:
            await self.kube.patch_status(res.RESOURCE, self.namespace, self.name, status)
        except KubeError as exc:
            if exc.status == 404:
                return  # being deleted
            raise
        self._last_status = status
