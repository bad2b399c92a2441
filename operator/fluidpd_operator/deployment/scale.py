"""Pods and scale: the children converge to the spec (auth secret, Services, router, worker
count), surplus workers are retired by draining the cheapest first, and the capacity fallback
adds or removes a worker when both phases stay pressured."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from fluidpd.controller.loop import FluidRoleController, post_admin
from fluidpd.core.fallback import ScaleDecision, ScaleDirection
from fluidpd.core.types import Role
from fluidpd_operator import resources as res
from fluidpd_operator.deployment.pods import (
    PodView,
    annotation,
    meta,
    next_names,
    pod_ready,
    pod_role,
    rfc3339,
    roles_for_new_pods,
)
from fluidpd_operator.deployment.state import DeploymentState
from fluidpd_operator.kube import KubeError

log = logging.getLogger("fluidpd.operator")


class PodsAndScale(DeploymentState):
    async def reconcile(self) -> None:
        """Level-based: the auth secret, per-role Services, the router, and the pod count."""
        self._errors = []
        await self.ensure_token()
        for role in Role:
            await self.kube.ensure(self.namespace, res.role_service(self.body, self.spec, role))
        router = res.router_deployment(self.body, self.spec, self.cfg.router_image)
        await self.kube.ensure(self.namespace, router)
        await self.kube.ensure(self.namespace, res.router_service(self.body, self.spec))
        await self.refresh_pods()
        await self.converge_pods()

    async def refresh_pods(self) -> PodView:
        selector = res.selector_string(res.worker_selector(self.name))
        self.view = PodView(await self.kube.list_pods(self.namespace, selector))
        return self.view

    async def converge_pods(self) -> None:
        """Create missing workers; pick and retire surplus ones (never delete a busy one)."""
        view = self.view
        serving = view.serving
        missing = self.target_workers - len(serving)
        if missing > 0:
            initial = not view.pods
            roles = roles_for_new_pods(missing, view.counts(), self.spec, initial, self._scale_hint)
            self._scale_hint = None
            names = next_names(f"{self.name}-worker", (meta(p)["name"] for p in view.pods), missing)
            for pod_name, role in zip(names, roles, strict=True):
                image = self.cfg.worker_image(self.spec.engine.backend)
                pod = res.worker_pod(self.body, self.spec, pod_name, role, image)
                try:
                    await self.kube.create(self.namespace, pod)
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                    continue
                log.info("%s/%s: created %s as %s", self.namespace, self.name, pod_name, role)
            await self.refresh_pods()
        elif missing < 0:
            for _ in range(-missing):
                if not await self.retire_one(self._scale_hint):
                    break
            self._scale_hint = None

    def _retire_candidates(self, role: Role | None) -> list[dict[str, Any]]:
        counts = self.view.counts()
        keep = {Role.PREFILL: self.spec.min_prefill, Role.DECODE: self.spec.min_decode}
        reports = self.role_ctl.reports if self.role_ctl else {}
        in_flight = self.role_ctl.in_flight if self.role_ctl else None
        switching = in_flight[0] if in_flight else None
        out = []
        for p in self.view.serving:
            r = pod_role(p)
            name = meta(p)["name"]
            if r is None or counts[r] <= keep[r] or name == switching:
                continue
            if annotation(p, res.DESIRED_ROLE):
                continue
            if role is not None and r is not role and counts[role] > keep[role]:
                continue
            out.append(p)

        def cost(p: dict[str, Any]) -> tuple[int, float, str]:
            report = reports.get(meta(p)["name"])
            # A pod that serves nothing yet costs nothing to remove.
            if report is None or not pod_ready(p):
                return (0, 0.0, meta(p)["name"])
            return (1, float(report.get("drain_cost", 0.0)), meta(p)["name"])

        return sorted(out, key=cost)

    async def retire_one(self, role: Role | None) -> bool:
        """Scale-in by one: annotate the cheapest-to-drain worker, then ask it to drain."""
        candidates = self._retire_candidates(role)
        if not candidates:
            self._errors.append("scale-in waits: every removable worker is busy or protected")
            return False
        pod = candidates[0]
        name = meta(pod)["name"]
        await self.kube.patch("v1", "Pod", self.namespace, name, {
            "metadata": {"annotations": {res.RETIRE: rfc3339()}}
        })  # fmt: skip
        meta(pod).setdefault("annotations", {})[res.RETIRE] = rfc3339()
        await self.ask_retire(pod)
        await self.both_events(pod, "ScalingIn", f"draining {pod_role(pod)} worker for removal")
        return True

    async def ask_retire(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        url = self.url(pod)
        if url is None or not pod_ready(pod):
            return None
        reports = self.role_ctl.reports if self.role_ctl else {}
        others = [
            r["url"]
            for w, r in reports.items()
            if w != meta(pod)["name"] and r["role"] == Role.DECODE.value
        ]
        body = {"drain": self.spec.fluid_role.drain_mode.value, "migrate_to": others}
        status, text = await post_admin(self.session, f"{url}/retire", body, self.headers)
        if status == 200:
            answer: dict[str, Any] = orjson.loads(text)
            return answer
        log.warning("retire %s: %s %s", meta(pod)["name"], status, text[:200])
        return None

    async def finish_retirements(self) -> None:
        """Delete retiring pods once drained (or when they serve nothing: not ready, gone)."""
        for pod in self.view.retiring:
            name = meta(pod)["name"]
            report = self.role_ctl.reports.get(name) if self.role_ctl else None
            report = report or await self._pressure(pod)
            if report is not None and not report.get("retiring"):
                await self.ask_retire(pod)  # the sidecar restarted: ask again
                continue
            if report is None or report.get("drained"):
                await self.kube.delete_pod(self.namespace, name, meta(pod)["uid"])
                await self.both_events(pod, "WorkerRemoved", "drained and deleted (scale-in)")

    def _settled(self, ctl: FluidRoleController) -> bool:
        v = self.view
        return (
            not v.retiring
            and all(pod_ready(p) for p in v.serving)
            and len(v.serving) == self.target_workers
            and ctl.in_flight is None
        )

    async def _fallback(self, ctl: FluidRoleController, decision: Any) -> None:
        pol = ctl.policy
        d: ScaleDecision | None = self.fallback.observe(
            time.time(),
            pol.last_recommendation,
            pol.last_pressure,
            len(self.view.serving),
            self.spec.workers,
            self._settled(ctl),
        )
        if d is None:
            return
        if d.direction is ScaleDirection.OUT:
            self.autoscaled += 1
            self._scale_hint = d.role
            reason, msg = "ScaledOut", f"adding a {d.role} worker: {d.reason}"
        else:
            if self.autoscaled <= 0:
                return
            self.autoscaled -= 1
            self._scale_hint = d.role
            reason, msg = "ScalingIn", f"removing a {d.role} worker: {d.reason}"
        await self.kube.patch_status(res.RESOURCE, self.namespace,
                                     self.name, {"autoscaledWorkers": self.autoscaled})  # fmt: skip
        await self.event(self.body, reason, msg)
