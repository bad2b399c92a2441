"""Role switches: the FluidRole control loop with the switch intent written to the pod first
(a restarted operator resumes it), inherited intents taken over one at a time, and the loop's
events turned into labels, annotations and Kubernetes Events."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from fluidpd.controller.demand import RouterDemand
from fluidpd.controller.loop import ControllerEvent, FluidRoleController, WorkerSource
from fluidpd.controller.metrics import DeploymentMetrics
from fluidpd.core.fluidrole import FluidRoleConfig, SwitchDecision
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO, DrainMode, Role
from fluidpd.profiles import ProfileError, parse_profile, resolve_profile
from fluidpd_operator import resources as res
from fluidpd_operator.deployment.pods import annotation, meta, pod_ready, rfc3339
from fluidpd_operator.deployment.state import DeploymentState
from fluidpd_operator.kube import KubeError

log = logging.getLogger("fluidpd.operator")


class Switches(DeploymentState):
    def _controller(self) -> FluidRoleController:
        if self.role_ctl is None:

            async def source() -> dict[str, str]:
                out = {}
                for p in self.view.serving:
                    url = self.url(p)
                    if url and pod_ready(p):
                        out[meta(p)["name"]] = url
                return out

            metrics = (
                self.metrics.for_deployment(self.namespace, self.name) if self.metrics else None
            )
            slo = SLO(self.spec.slo.ttft_seconds, self.spec.slo.tpot_seconds)
            demand = RouterDemand(self.session, lambda: self._router_urls, lambda: self.headers)
            self.role_ctl = _AnnotatingController(
                self,
                source,
                self.spec.fluidrole_config(),
                self.session,
                self.token,
                metrics,
                profile=self.profile,
                slo=slo,
                demand=demand,
            )
            self._seen_events = 0
            self._inherited = None
        return self.role_ctl

    async def load_profile(self) -> None:
        """The workers' profile, for the predictive rule's forecasts: the ConfigMap the spec
        mounts into the workers (``model.profileConfigMap``, key ``profile.yaml``), else the
        shipped one for the model and GPU. Read once per spec; an API error is retried next
        interval (the controller is rebuilt when it comes, not while a switch is in flight), a
        bad profile is not (the rule is then the paper's, and the controller's log says so)."""
        if self._profile_read:
            return
        m = self.spec.model
        try:
            if m.profile_config_map:
                cm = await self.kube.get("v1", "ConfigMap", self.namespace, m.profile_config_map)
                text = (cm.get("data") or {}).get(res.PROFILE_KEY)
                source = f"ConfigMap {self.namespace}/{m.profile_config_map}"
                if text is None:
                    raise ProfileError(f"{source} has no key {res.PROFILE_KEY!r}")
                profile: Profile | None = parse_profile(text, source)
            else:
                profile = resolve_profile(m.name, m.gpu, None)
        except KubeError as exc:
            log.warning("%s/%s: profile not read (retried): %s", self.namespace, self.name,
                        exc.reason)  # fmt: skip
            return
        except ProfileError as exc:
            log.warning("%s/%s: %s", self.namespace, self.name, exc)
            profile = None
        if profile != self.profile:
            if self.role_ctl is not None and self.role_ctl.in_flight is not None:
                return  # the controller is rebuilt once its switch is done (read again then)
            self.profile, self.role_ctl = profile, None
        self._profile_read = True

    async def record_intent(self, d: SwitchDecision) -> None:
        """Persist the switch before asking the sidecar: a restarted operator resumes it."""
        await self.kube.patch("v1", "Pod", self.namespace, d.worker, {
            "metadata": {"annotations": {
                res.DESIRED_ROLE: d.target.value,
                res.SWITCH_STARTED: rfc3339(),
                res.SWITCH_DRAIN: d.drain_mode.value,
            }}
        })  # fmt: skip

    async def _resume_switches(self, ctl: FluidRoleController) -> None:
        """Take over the switches whose intent was on a pod when this controller started (a new
        operator process, or new settings), one at a time; later intents are its own."""
        if self._inherited is None:
            if not ctl.reports:
                return  # no sidecar has answered yet: look again next interval
            self._inherited = {
                meta(p)["name"] for p in self.view.serving if annotation(p, res.DESIRED_ROLE)
            }
        pods = {meta(p)["name"]: p for p in self.view.serving}
        for name in sorted(self._inherited):
            pod = pods.get(name)
            desired = annotation(pod, res.DESIRED_ROLE) if pod else None
            if pod is None or desired is None:
                self._inherited.discard(name)
                continue
            if ctl.in_flight is not None:
                return
            drain = DrainMode(annotation(pod, res.SWITCH_DRAIN) or DrainMode.WAIT.value)
            if await ctl.resume(name, Role(desired), drain):
                self._inherited.discard(name)
                log.info("%s/%s: resumed the switch of %s to %s", self.namespace, self.name,
                         name, desired)  # fmt: skip
            return

    async def _handle_events(self, ctl: FluidRoleController) -> None:
        new: list[ControllerEvent] = ctl.events[self._seen_events :]
        self._seen_events = len(ctl.events)
        pods = {meta(p)["name"]: p for p in self.view.pods}
        for e in new:
            pod = pods.get(e.worker)
            if e.kind == "switch-finished" and pod is not None:
                to = e.detail["to"]
                await self.kube.patch("v1", "Pod", self.namespace, e.worker, {"metadata": {
                    "labels": {res.ROLE_LABEL: to},
                    "annotations": {res.DESIRED_ROLE: None, res.SWITCH_STARTED: None,
                                    res.SWITCH_DRAIN: None},
                }})  # fmt: skip
                meta(pod)["labels"][res.ROLE_LABEL] = to
                meta(pod).get("annotations", {}).pop(res.DESIRED_ROLE, None)
                drain = float(e.detail.get("drain_s", 0.0))
                self.last_switch = {
                    "time": rfc3339(e.t),
                    "pod": e.worker,
                    "from": Role(to).other.value,
                    "to": to,
                    "drainSeconds": round(drain, 3),
                }
                await self.both_events(pod, "SwitchCompleted", f"now {to} (drain {drain:.2f} s)")
            elif e.kind == "switch-started" and pod is not None:
                msg = f"{e.detail['from']} -> {e.detail['to']} in place ({e.detail['drain']} drain)"
                f = e.detail.get("forecast")
                if f:  # the predictive rule's reason, for `kubectl describe`
                    msg += f"; forecast bottleneck {f['before']:.2f} -> {f['after']:.2f}"
                await self.both_events(pod, "SwitchStarted", msg)
            elif e.kind == "switch-resumed" and pod is not None:
                msg = f"to {e.detail['to']} (taken over after an operator restart)"
                await self.both_events(pod, "SwitchResumed", msg)
            elif e.kind == "switch-refused" and pod is not None:
                await self.kube.patch("v1", "Pod", self.namespace, e.worker, {"metadata": {
                    "annotations": {res.DESIRED_ROLE: None, res.SWITCH_STARTED: None,
                                    res.SWITCH_DRAIN: None}}})  # fmt: skip
                await self.event(pod, "SwitchRefused", str(e.detail.get("detail", "")), True)
            elif e.kind == "switch-abandoned":
                await self.event(self.body, "SwitchAbandoned", f"{e.worker} went away", True)


class _AnnotatingController(FluidRoleController):
    """``fluidpd controller``'s loop, with the switch intent written to the pod first."""

    def __init__(
        self,
        owner: Switches,
        source: WorkerSource,
        cfg: FluidRoleConfig,
        session: aiohttp.ClientSession,
        token: str | None,
        metrics: DeploymentMetrics | None,
        **rule: Any,
    ) -> None:
        super().__init__(source, cfg, session, token, owner.poke_routers, metrics, **rule)
        self.owner = owner

    async def _start_switch(self, d: SwitchDecision, now: float) -> None:
        try:
            await self.owner.record_intent(d)
        except KubeError as exc:
            log.warning("switch of %s not started: %s", d.worker, exc)
            self.policy.switch_finished(d.worker, now)
            return
        await super()._start_switch(d, now)
