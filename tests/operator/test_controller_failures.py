"""DeploymentController's failure paths, in process: an in-memory API server stand-in and real
HTTP sidecar stand-ins on loopback addresses (one per pod IP), so each path is reached on
purpose rather than by chance in an e2e run.

Paths: a retiring worker whose sidecar restarted (asked again, not deleted), a retiring worker
that no longer answers (deleted), a switch intent the API server refuses (the sidecar is never
asked, the policy is freed), a switch the sidecar refuses (intent removed, warning Event), the
switching worker vanishing mid-hand-off (switch abandoned, warning Event), and a scale-in with
every removable worker protected (Degraded says so).
"""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from fluidpd.core.fluidrole import PoolPressure, SwitchDecision
from fluidpd.core.types import DrainMode, Role
from fluidpd_operator import resources as res
from fluidpd_operator.deployment import DeploymentController
from fluidpd_operator.kube import KubeError

NS, NAME = "ns", "llm"


class FakeKube:
    """The calls DeploymentController makes, on dicts; ``refuse`` makes a pod's patches fail."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.events: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {}
        self.deleted: list[str] = []
        self.refuse: set[str] = set()
        self.configmaps: dict[str, dict[str, Any]] = {}

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        if kind != "ConfigMap" or name not in self.configmaps:
            raise KubeError(404, f'{kind.lower()}s "{name}" not found')
        return copy.deepcopy(self.configmaps[name])

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        want = dict(kv.split("=", 1) for kv in selector.split(","))
        return [
            copy.deepcopy(p)
            for p in self.pods.values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())
        ]

    async def create(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Event":
            self.events.append(obj)
        return obj

    async def ensure(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        return obj

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        if name in self.refuse:
            raise KubeError(409, "the object has been modified")
        meta = self.pods[name]["metadata"]
        for key in ("labels", "annotations"):
            for k, v in patch.get("metadata", {}).get(key, {}).items():
                if v is None:
                    meta.setdefault(key, {}).pop(k, None)
                else:
                    meta.setdefault(key, {})[k] = v
        return self.pods[name]

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.pods.pop(name, None)
        self.deleted.append(name)

    async def patch_status(
        self, resource: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        self.status |= status

    def reasons(self) -> list[tuple[str, str, str]]:
        return [(e["reason"], e["type"], e["involvedObject"]["name"]) for e in self.events]


@dataclass
class FakeSidecar:
    """A sidecar's admin and pressure endpoints; ``answers`` False: it stops answering."""

    name: str
    role: Role
    ip: str
    report: dict[str, Any] = field(default_factory=dict)
    role_status: int = 200
    answers: bool = True
    posted: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.report = {
            "worker": self.name, "role": self.role.value, "state": "active",
            "attributable_ppi": 0.0, "dpi_load": 0.0, "dpi_adm": 0.0, "drain_cost": 0.0,
            "retiring": False, "drained": False,
        } | self.report  # fmt: skip

    async def pressure(self, _: web.Request) -> web.Response:
        if not self.answers:
            return web.Response(status=503)
        return web.Response(body=orjson.dumps(self.report), content_type="application/json")

    async def post(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.posted.append((request.path, body))
        if request.path == "/role":
            return web.Response(status=self.role_status, text="not now: draining")
        self.report["retiring"] = True
        return web.Response(body=orjson.dumps({"retiring": True}), content_type="application/json")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pod(sidecar: FakeSidecar, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sidecar.name, "namespace": NS, "uid": f"uid-{sidecar.name}",
            "labels": {**res.labels(NAME, "worker"), res.ROLE_LABEL: sidecar.role.value},
            "annotations": dict(annotations or {}),
        },
        "status": {"podIP": sidecar.ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


Scenario = Callable[[DeploymentController, FakeKube, dict[str, FakeSidecar]], Awaitable[None]]


def run(
    sidecars: list[FakeSidecar],
    scenario: Scenario,
    annotations: dict[str, dict[str, str]] | None = None,
    **spec: Any,
) -> FakeKube:
    """Serve every sidecar on its own loopback address (one port for all: the operator
    derives a worker's URL from its pod IP and ``engine.port``), then play ``scenario``."""
    port = _free_port()
    kube = FakeKube([_pod(s, (annotations or {}).get(s.name)) for s in sidecars])

    async def main() -> None:
        runners = []
        for s in sidecars:
            app = web.Application()
            app.router.add_get("/pressure", s.pressure)
            app.router.add_post("/role", s.post)
            app.router.add_post("/retire", s.post)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, s.ip, port).start()
            runners.append(runner)
        body = {
            "metadata": {"name": NAME, "namespace": NS, "uid": "uid-llm", "generation": 1},
            "spec": {"model": {"name": "llama-3.1-8b"}, "workers": len(sidecars),
                     "engine": {"port": port}, **spec},
            "status": {},
        }  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                ctl = DeploymentController(kube, body, session)  # type: ignore[arg-type]
                ctl.token = "t"
                await scenario(ctl, kube, {s.name: s for s in sidecars})
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(main())
    return kube


def _workers(*roles: Role) -> list[FakeSidecar]:
    return [FakeSidecar(f"{NAME}-worker-{i}", r, f"127.0.0.{i + 2}") for i, r in enumerate(roles)]


def test_a_retiring_worker_whose_sidecar_restarted_is_asked_again_then_deleted() -> None:
    sidecars = _workers(Role.PREFILL, Role.DECODE, Role.DECODE)
    victim = sidecars[2]

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        await ctl.refresh_pods()
        await ctl.finish_retirements()  # the sidecar forgot (restart): not retiring
        assert victim.posted and victim.posted[0][0] == "/retire"
        assert kube.deleted == []
        victim.report["drained"] = True  # it drained after being asked again
        await ctl.refresh_pods()
        await ctl.finish_retirements()

    kube = run(sidecars, scenario, {victim.name: {res.RETIRE: "2026-12-02T00:00:00Z"}})
    assert kube.deleted == [victim.name]
    assert ("WorkerRemoved", "Normal", victim.name) in kube.reasons()


def test_a_retiring_worker_that_no_longer_answers_is_deleted() -> None:
    sidecars = _workers(Role.PREFILL, Role.DECODE, Role.DECODE)
    sidecars[1].answers = False

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        await ctl.refresh_pods()
        await ctl.finish_retirements()

    kube = run(sidecars, scenario, {sidecars[1].name: {res.RETIRE: "2026-12-02T00:00:00Z"}})
    assert kube.deleted == [sidecars[1].name]
    assert sidecars[1].posted == []


def _decision(worker: str) -> SwitchDecision:
    return SwitchDecision(worker, Role.PREFILL, Role.DECODE, DrainMode.WAIT, PoolPressure(0, 0, 1))


def test_a_switch_whose_intent_cannot_be_written_is_never_asked_of_the_sidecar() -> None:
    sidecars = _workers(Role.PREFILL, Role.PREFILL, Role.DECODE)
    first = sidecars[0]

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        kube.refuse.add(first.name)
        await ctl.refresh_pods()
        role_ctl = ctl._controller()
        await role_ctl.step()  # reads every sidecar's pressure
        await role_ctl._start_switch(_decision(first.name), 0.0)
        assert role_ctl.in_flight is None  # the policy is free for the next decision

    kube = run(sidecars, scenario)
    assert first.posted == []  # without a persisted intent a restart could not resume it
    assert res.DESIRED_ROLE not in kube.pods[first.name]["metadata"]["annotations"]


def test_a_switch_the_sidecar_refuses_drops_the_intent_with_a_warning() -> None:
    sidecars = _workers(Role.PREFILL, Role.PREFILL, Role.DECODE)
    first = sidecars[0]
    first.role_status = 409

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        await ctl.refresh_pods()
        role_ctl = ctl._controller()
        await role_ctl.step()
        await role_ctl._start_switch(_decision(first.name), 0.0)
        assert res.DESIRED_ROLE in kube.pods[first.name]["metadata"]["annotations"]
        await ctl._handle_events(role_ctl)

    kube = run(sidecars, scenario)
    assert [path for path, _ in first.posted] == ["/role"]
    assert res.DESIRED_ROLE not in kube.pods[first.name]["metadata"]["annotations"]
    assert ("SwitchRefused", "Warning", first.name) in kube.reasons()


def test_the_switching_worker_vanishing_mid_hand_off_abandons_the_switch() -> None:
    sidecars = _workers(Role.PREFILL, Role.PREFILL, Role.DECODE)
    first = sidecars[0]

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        await ctl.refresh_pods()
        role_ctl = ctl._controller()
        await role_ctl.step()
        await role_ctl._start_switch(_decision(first.name), 0.0)
        assert role_ctl.in_flight == (first.name, Role.DECODE)
        first.answers = False  # the pod dies while draining
        await ctl.step()
        assert role_ctl.in_flight is None

    kube = run(sidecars, scenario)
    assert ("SwitchStarted", "Normal", first.name) in kube.reasons()
    assert ("SwitchAbandoned", "Warning", NAME) in kube.reasons()


def test_scale_in_with_every_removable_worker_protected_says_why_in_degraded() -> None:
    sidecars = _workers(Role.PREFILL, Role.DECODE)  # both at their role's minimum

    async def scenario(ctl: DeploymentController, kube: FakeKube, s: dict[str, Any]) -> None:
        ctl.spec = ctl.spec.model_copy(update={"workers": 1})
        await ctl.step()

    kube = run(sidecars, scenario)
    assert kube.deleted == [] and all(not s.posted for s in sidecars)
    degraded = next(c for c in kube.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "scale-in waits" in degraded["message"]
