"""What one FluidPDDeployment's controller holds between intervals, and the calls every concern
shares (headers, sidecar URLs, Events, the auth token). The concerns are mixins over it:
``scale`` (pods and scale), ``switches``, ``routers`` (router sync) and ``status``."""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from typing import Any

import aiohttp

from fluidpd.controller.loop import FluidRoleController, fetch_pressure
from fluidpd.controller.metrics import ControllerMetrics
from fluidpd.core.fallback import CapacityFallback
from fluidpd.core.profile import Profile
from fluidpd.core.types import Role
from fluidpd_operator import resources as res
from fluidpd_operator.config import OperatorConfig
from fluidpd_operator.deployment.pods import PodView, meta, rfc3339
from fluidpd_operator.kube import Kube, KubeError, event_manifest
from fluidpd_operator.spec import DeploymentSpec

log = logging.getLogger("fluidpd.operator")


class DeploymentState:
    """The state; see ``DeploymentController`` for what runs on it."""

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
        self.namespace: str = meta(body)["namespace"]
        self.name: str = meta(body)["name"]
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
        self.last_switch: dict[str, Any] | None = body.get("status", {}).get("lastSwitch")
        self.routers_ready = 0
        self._router_urls: list[str] = []
        #: The workers' profile, for the predictive switch rule (``load_profile``); None when
        #: it could not be read, and then the rule is the paper's.
        self.profile: Profile | None = None
        self._profile_read = False

    # -- spec ---------------------------------------------------------------------------------
    def update(self, body: dict[str, Any]) -> None:
        """A new version of the object: new spec, new policy settings (the window restarts)."""
        spec = DeploymentSpec.model_validate(body["spec"])
        if spec != self.spec:
            self.spec = spec
            self.role_ctl = None
            self._profile_read = False
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
        await self.event(self.body, reason, f"{meta(pod)['name']}: {message}")

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

    async def _pressure(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        url = self.url(pod)
        return await fetch_pressure(self.session, url) if url else None

    async def poke_routers(self) -> None:
        """Tell the routers to re-read the workers now (``RouterSync``)."""
        raise NotImplementedError
