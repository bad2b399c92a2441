"""One FluidPDDeployment's controller: children, role switches, scale in/out, status.

Everything it needs to pick up after a restart lives in the cluster: a switch in progress is the
pod's ``fluidpd.io/desired-role`` annotation (written *before* the sidecar is asked to switch),
a scale-in is the ``fluidpd.io/retire`` annotation (written before the sidecar is asked to
drain), and the fallback's extra workers are ``status.autoscaledWorkers``. The decisions are the
core's (``FluidRolePolicy`` through ``FluidRoleController``, ``CapacityFallback``); this module
carries them out with the API server and the sidecars.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from fluidpd.cli.sidecar_cmd import ENGINES as SIDECAR_ENGINES
from fluidpd.controller.loop import (
    ControllerEvent,
    FluidRoleController,
    WorkerSource,
    fetch_pressure,
    post_admin,
)
from fluidpd.controller.metrics import ControllerMetrics, DeploymentMetrics
from fluidpd.core.fallback import CapacityFallback, ScaleDecision, ScaleDirection
from fluidpd.core.fluidrole import FluidRoleConfig, Recommendation, SwitchDecision
from fluidpd.core.types import DrainMode, Role, RoleState
from fluidpd_operator import resources as res
from fluidpd_operator.config import OperatorConfig
from fluidpd_operator.kube import Kube, KubeError, event_manifest
from fluidpd_operator.spec import DeploymentSpec

log = logging.getLogger("fluidpd.operator")

#: Re-send the router its worker set at least this often (a restarted router starts empty).
ROUTER_RESYNC_S = 10.0


def rfc3339(t: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj["metadata"]
    return meta


def pod_role(pod: dict[str, Any]) -> Role | None:
    value = _meta(pod).get("labels", {}).get(res.ROLE_LABEL)
    return Role(value) if value in (Role.PREFILL.value, Role.DECODE.value) else None


def pod_ready(pod: dict[str, Any]) -> bool:
    for c in pod.get("status", {}).get("conditions", []):
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def why_not_ready(pod: dict[str, Any]) -> str:
    """What keeps a pod from running, as the scheduler or the kubelet reports it (e.g. an
    unbound claim, a model directory that fails its hostPath check), or "" when nothing says."""
    status = pod.get("status", {})
    for c in status.get("conditions", []):
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return ": ".join(x for x in (c.get("reason") or "Unschedulable", c.get("message")) if x)
    for cs in status.get("containerStatuses", []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return ": ".join(x for x in (waiting["reason"], waiting.get("message")) if x)
    return ""


def annotation(pod: dict[str, Any], key: str) -> str | None:
    value = _meta(pod).get("annotations", {}).get(key)
    return str(value) if value is not None else None


def next_names(prefix: str, taken: Iterable[str], n: int) -> list[str]:
    """The ``n`` lowest free ``<prefix>-<i>`` names (stable, StatefulSet-like)."""
    used = set(taken)
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"{prefix}-{i}"
        if name not in used:
            out.append(name)
        i += 1
    return out


def roles_for_new_pods(
    n: int,
    counts: dict[Role, int],
    spec: DeploymentSpec,
    initial: bool,
    hint: Role | None,
) -> list[Role]:
    """Roles of ``n`` pods to add: the initial split on first creation; otherwise the per-role
    minimums first, then ``hint`` (the more pressured phase) or, without one, whichever role is
    furthest below its share of the initial split."""
    counts = dict(counts)
    out: list[Role] = []
    if initial and sum(counts.values()) == 0:
        p = spec.initial_prefill()
        return [Role.PREFILL] * p + [Role.DECODE] * (n - p) if n >= p else [Role.PREFILL] * n
    share = spec.initial_prefill() / spec.workers
    for _ in range(n):
        if counts[Role.PREFILL] < spec.min_prefill:
            role = Role.PREFILL
        elif counts[Role.DECODE] < spec.min_decode:
            role = Role.DECODE
        elif hint is not None:
            role = hint
        else:
            total = counts[Role.PREFILL] + counts[Role.DECODE] + 1
            role = Role.PREFILL if counts[Role.PREFILL] < share * total else Role.DECODE
        counts[role] += 1
        out.append(role)
    return out


@dataclass
class PodView:
    """The worker pods of one control interval, sorted by what they are doing."""

    pods: list[dict[str, Any]]

    @property
    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if not _meta(p).get("deletionTimestamp")]

    @property
    def retiring(self) -> list[dict[str, Any]]:
        return [p for p in self.live if annotation(p, res.RETIRE)]

    @property
    def serving(self) -> list[dict[str, Any]]:
        return [p for p in self.live if not annotation(p, res.RETIRE)]

    def counts(self) -> dict[Role, int]:
        out = {Role.PREFILL: 0, Role.DECODE: 0}
        for p in self.serving:
            role = pod_role(p)
            if role is not None:
                out[role] += 1
        return out


class DeploymentController:
    """Owns one FluidPDDeployment. ``reconcile`` converges its children to the spec;
    ``step`` is one control interval (pressure, switches, fallback, scale-in, router, status)."""

    def __init__(
        self,
        kube: Kube,
        body: dict[str, Any],
        session: aiohttp.ClientSession,
        cfg: OperatorConfig | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.cfg = cfg or OperatorConfig()
        self.session = session
        self.lock = asyncio.Lock()
        self.metrics = metrics
        self.body = body
        self.spec = DeploymentSpec.model_validate(body["spec"])
        self.namespace: str = _meta(body)["namespace"]
        self.name: str = _meta(body)["name"]
        self.token: str | None = None
        self.autoscaled = int(body.get("status", {}).get("autoscaledWorkers", 0) or 0)
        self.role_ctl: FluidRoleController | None = None
        self.fallback = CapacityFallback(self.spec.fallback_config(), self.spec.fluidrole_config())
        self.view = PodView([])
        self._seen_events = 0
        self._last_status: dict[str, Any] = {}
        self._conditions: dict[str, dict[str, Any]] = {
            c["type"]: c for c in body.get("status", {}).get("conditions", [])
        }
        self._router_sync: dict[str, tuple[float, bytes]] = {}
        #: Pods with a switch intent from before this controller; None until first looked at.
        self._inherited: set[str] | None = None
        self._scale_hint: Role | None = None
        self._errors: list[str] = []
        self._backend_warned = False
        self.last_switch: dict[str, Any] | None = body.get("status", {}).get("lastSwitch")
        self.routers_ready = 0
        self._router_urls: list[str] = []

    # -- spec ---------------------------------------------------------------------------------
    def update(self, body: dict[str, Any]) -> None:
        """A new version of the object: new spec, new policy settings (the window restarts)."""
        spec = DeploymentSpec.model_validate(body["spec"])
        if spec != self.spec:
            self.spec = spec
            self.role_ctl = None
            self.fallback = CapacityFallback(spec.fallback_config(), spec.fluidrole_config())
        self.body = body

    @property
    def target_workers(self) -> int:
        return self.spec.workers + self.autoscaled

    @property
    def headers(self) -> dict[str, str]:
        h = {"content-type": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def url(self, pod: dict[str, Any]) -> str | None:
        ip = pod.get("status", {}).get("podIP")
        return f"http://{ip}:{self.spec.engine.port}" if ip else None

    # -- events -------------------------------------------------------------------------------
    async def event(
        self, obj: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        obj = {"apiVersion": "v1", "kind": "Pod", **obj} if "kind" not in obj else obj
        body = event_manifest(obj, reason, message, "Warning" if warning else "Normal", rfc3339())
        try:
            await self.kube.create(self.namespace, body)
        except KubeError as exc:  # an event is best effort; never fail the interval for one
            log.warning("event %s not posted: %s", reason, exc)

    async def both_events(self, pod: dict[str, Any], reason: str, message: str) -> None:
        await self.event(pod, reason, message)
        await self.event(self.body, reason, f"{_meta(pod)['name']}: {message}")

    # -- children -----------------------------------------------------------------------------
    async def ensure_token(self) -> None:
        name = res.auth_secret_name(self.name, self.spec)
        key = res.auth_secret_key(self.spec)
        try:
            secret = await self.kube.get("v1", "Secret", self.namespace, name)
        except KubeError as exc:
            if exc.status != 404 or self.spec.auth_secret_ref is not None:
                self._errors.append(f"auth secret {name}: {exc.reason}")
                return
            try:
                secret = await self.kube.create(
                    self.namespace, res.auth_secret(self.body, secrets.token_urlsafe(32))
                )
            except KubeError as err:
                self._errors.append(f"auth secret {name} could not be created: {err.reason}")
                return
        data = secret.get("data", {}).get(key)
        if data is None:
            self._errors.append(f"auth secret {name} has no key {key!r}")
            return
        self.token = base64.b64decode(data).decode()

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

    async def backend_runs(self) -> bool:
        """A backend the CRD admits but this release's sidecar does not run (none since the
        sidecar runs ``sglang``, issue #13): its workers would only crash-loop on the flag, so
        none are made and Degraded says why.
        """
        backend = self.spec.engine.backend
        if backend in SIDECAR_ENGINES:
            return True
        msg = (
            f"engine.backend {backend!r}: this release's sidecar runs "
            f"{' or '.join(SIDECAR_ENGINES)}; no workers are created"
        )
        self._errors.append(msg)
        if not self._backend_warned:
            self._backend_warned = True
            await self.event(self.body, "UnsupportedBackend", msg, warning=True)
        return False

    async def refresh_pods(self) -> PodView:
        selector = res.selector_string(res.worker_selector(self.name))
        self.view = PodView(await self.kube.list_pods(self.namespace, selector))
        return self.view

    async def converge_pods(self) -> None:
        """Create missing workers; pick and retire surplus ones (never delete a busy one)."""
        if not await self.backend_runs():
            return
        view = self.view
        serving = view.serving
        missing = self.target_workers - len(serving)
        if missing > 0:
            initial = not view.pods
            roles = roles_for_new_pods(missing, view.counts(), self.spec, initial, self._scale_hint)
            self._scale_hint = None
            names = next_names(
                f"{self.name}-worker", (_meta(p)["name"] for p in view.pods), missing
            )
            for pod_name, role in zip(names, roles, strict=True):
                pod = res.worker_pod(self.body, self.spec, pod_name, role, self.cfg.sidecar_image)
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
            name = _meta(p)["name"]
            if r is None or counts[r] <= keep[r] or name == switching:
                continue
            if annotation(p, res.DESIRED_ROLE):
                continue
            if role is not None and r is not role and counts[role] > keep[role]:
                continue
            out.append(p)

        def cost(p: dict[str, Any]) -> tuple[int, float, str]:
            report = reports.get(_meta(p)["name"])
            # A pod that serves nothing yet costs nothing to remove.
            if report is None or not pod_ready(p):
                return (0, 0.0, _meta(p)["name"])
            return (1, float(report.get("drain_cost", 0.0)), _meta(p)["name"])

        return sorted(out, key=cost)

    async def retire_one(self, role: Role | None) -> bool:
        """Scale-in by one: annotate the cheapest-to-drain worker, then ask it to drain."""
        candidates = self._retire_candidates(role)
        if not candidates:
            self._errors.append("scale-in waits: every removable worker is busy or protected")
            return False
        pod = candidates[0]
        name = _meta(pod)["name"]
        await self.kube.patch("v1", "Pod", self.namespace, name, {
            "metadata": {"annotations": {res.RETIRE: rfc3339()}}
        })  # fmt: skip
        _meta(pod).setdefault("annotations", {})[res.RETIRE] = rfc3339()
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
            if w != _meta(pod)["name"] and r["role"] == Role.DECODE.value
        ]
        body = {"drain": self.spec.fluid_role.drain_mode.value, "migrate_to": others}
        status, text = await post_admin(self.session, f"{url}/retire", body, self.headers)
        if status == 200:
            answer: dict[str, Any] = orjson.loads(text)
            return answer
        log.warning("retire %s: %s %s", _meta(pod)["name"], status, text[:200])
        return None

    async def finish_retirements(self) -> None:
        """Delete retiring pods once drained (or when they serve nothing: not ready, gone)."""
        for pod in self.view.retiring:
            name = _meta(pod)["name"]
            report = self.role_ctl.reports.get(name) if self.role_ctl else None
            report = report or await self._pressure(pod)
            if report is not None and not report.get("retiring"):
                await self.ask_retire(pod)  # the sidecar restarted: ask again
                continue
            if report is None or report.get("drained"):
                await self.kube.delete_pod(self.namespace, name, _meta(pod)["uid"])
                await self.both_events(pod, "WorkerRemoved", "drained and deleted (scale-in)")

    async def _pressure(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        url = self.url(pod)
        return await fetch_pressure(self.session, url) if url else None

    # -- role switches ------------------------------------------------------------------------
    def _controller(self) -> FluidRoleController:
        if self.role_ctl is None:

            async def source() -> dict[str, str]:
                out = {}
                for p in self.view.serving:
                    url = self.url(p)
                    if url and pod_ready(p):
                        out[_meta(p)["name"]] = url
                return out

            metrics = (
                self.metrics.for_deployment(self.namespace, self.name) if self.metrics else None
            )
            self.role_ctl = _AnnotatingController(
                self, source, self.spec.fluidrole_config(), self.session, self.token, metrics
            )
            self._seen_events = 0
            self._inherited = None
        return self.role_ctl

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
                _meta(p)["name"] for p in self.view.serving if annotation(p, res.DESIRED_ROLE)
            }
        pods = {_meta(p)["name"]: p for p in self.view.serving}
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
        pods = {_meta(p)["name"]: p for p in self.view.pods}
        for e in new:
            pod = pods.get(e.worker)
            if e.kind == "switch-finished" and pod is not None:
                to = e.detail["to"]
                await self.kube.patch("v1", "Pod", self.namespace, e.worker, {"metadata": {
                    "labels": {res.ROLE_LABEL: to},
                    "annotations": {res.DESIRED_ROLE: None, res.SWITCH_STARTED: None,
                                    res.SWITCH_DRAIN: None},
                }})  # fmt: skip
                _meta(pod)["labels"][res.ROLE_LABEL] = to
                _meta(pod).get("annotations", {}).pop(res.DESIRED_ROLE, None)
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

    # -- one interval -------------------------------------------------------------------------
    async def step(self) -> None:
        async with self.lock:
            self._errors = [e for e in self._errors if e.startswith("auth")]
            if self.token is None:
                await self.ensure_token()
            await self.refresh_pods()
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

    async def sync_routers(self) -> None:
        selector = res.selector_string({
            res.DEPLOYMENT_LABEL: self.name, res.COMPONENT_LABEL: "router"
        })  # fmt: skip
        routers = await self.kube.list_pods(self.namespace, selector)
        workers = {
            _meta(p)["name"]: url
            for p in self.view.live
            if (url := self.url(p)) is not None and pod_role(p) is not None
        }
        payload = orjson.dumps({"workers": dict(sorted(workers.items()))})
        now = time.monotonic()
        alive = set()
        self._router_urls = []
        for r in routers:
            ip = r.get("status", {}).get("podIP")
            if not ip or not pod_ready(r) or _meta(r).get("deletionTimestamp"):
                continue
            uid = _meta(r)["uid"]
            alive.add(uid)
            self._router_urls.append(f"http://{ip}:{self.spec.router.port}")
            last = self._router_sync.get(uid)
            if last and last[1] == payload and now - last[0] < ROUTER_RESYNC_S:
                continue
            url = f"http://{ip}:{self.spec.router.port}/admin/workers"
            try:
                async with self.session.put(
                    url, data=payload, headers=self.headers, timeout=aiohttp.ClientTimeout(total=3)
                ) as resp:
                    if resp.status == 200:
                        self._router_sync[uid] = (now, payload)
                    else:
                        log.warning("router %s: %s", _meta(r)["name"], resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("router %s unreachable: %s", _meta(r)["name"], exc)
        self._router_sync = {k: v for k, v in self._router_sync.items() if k in alive}
        self.routers_ready = len(alive)

    async def poke_routers(self) -> None:
        """A switch started or finished: the routers re-read every worker now, not at their
        next poll."""
        for base in self._router_urls:
            try:
                async with self.session.post(
                    f"{base}/admin/poll", headers=self.headers, timeout=aiohttp.ClientTimeout(2)
                ):
                    pass
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("router %s: %s", base, exc)

    # -- status -------------------------------------------------------------------------------
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
        for p in sorted(v.live, key=lambda p: _meta(p)["name"]):
            name = _meta(p)["name"]
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
        live = {_meta(p)["name"]: p for p in v.live}
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
            "observedGeneration": _meta(self.body).get("generation"),
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


class _AnnotatingController(FluidRoleController):
    """``fluidpd controller``'s loop, with the switch intent written to the pod first."""

    def __init__(
        self,
        owner: DeploymentController,
        source: WorkerSource,
        cfg: FluidRoleConfig,
        session: aiohttp.ClientSession,
        token: str | None,
        metrics: DeploymentMetrics | None,
    ) -> None:
        super().__init__(source, cfg, session, token, owner.poke_routers, metrics)
        self.owner = owner

    async def _start_switch(self, d: SwitchDecision, now: float) -> None:
        try:
            await self.owner.record_intent(d)
        except KubeError as exc:
            log.warning("switch of %s not started: %s", d.worker, exc)
            self.policy.switch_finished(d.worker, now)
            return
        await super()._start_switch(d, now)
