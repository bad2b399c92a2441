"""The operator SIGKILLed in the middle of scale-ins and of role switches, on the test plane
under load through the router: the steps ``e2e/test_operator_chaos.py`` runs once and asserts
on, and ``python -m harness.drill_operator`` repeats and records (one code path for both).

Scale-in: the kill lands the moment a worker pod gets its ``fluidpd.io/retire`` annotation (a
watch on the pods, not a poll): the operator has decided the scale-in and may or may not have
asked the sidecar to drain yet; the restarted operator must finish it from what is in the
cluster.

Switches: the three points where an operator can die in one: the intent is on the pod and the
sidecar was never asked; the sidecar is draining; the sidecar has finished but the pod's label
is stale. Each is staged the way the operator leaves it (its ``fluidpd.io/desired-role``
annotation, then the same ``POST /role`` it sends), with the operator SIGKILLed first.

Every kill is a ``Kill`` record, appended when the operator dies and filled in as the restarted
operator finishes, so a caller keeps what happened up to a timeout too.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from fluidpd.drills.load import Outcome
from harness.controlplane import ControlPlane
from harness.load import HANG_S, MODEL, Load
from harness.operator import (
    Operator,
    admin_token,
    apply,
    kubectl_json,
    router_url,
    router_workers,
    wait_ready,
    worker_pods,
)
from harness.wait import wait_for

RETIRE = "fluidpd.io/retire"
#: The scale-ins of one scale-in round: 6 workers (3P3D) down to 3, one kill each.
SCALE_FROM = 6
SCALE_TO = (5, 4, 3)
#: The switches of one switch round on 2P2D: (where the operator dies, source role, drain).
#: The roles alternate so that both pools keep a worker.
SWITCH_STAGES = (
    ("intent only", "decode", "migrate"),
    ("sidecar draining", "prefill", "wait"),
    ("sidecar done, label stale", "decode", "migrate"),
)
SWITCH_WORKERS = 4


@dataclass(slots=True)
class Kill:
    """One SIGKILL of the operator and what followed. Times are epoch seconds."""

    #: Where it died: "scale-in: retire annotation set" or "switch: <stage>".
    where: str
    #: The pod the interrupted scale-in retires or the interrupted switch flips.
    pod: str
    #: "6->5" for a scale-in; "decode->prefill (migrate)" for a switch.
    change: str
    killed_at: float
    #: Scale-in only: the retiring pod still existed right after the kill (nobody had deleted
    #: it yet), i.e. the kill was mid-way.
    mid_way: bool | None = None
    restarted_at: float = 0.0
    #: Restart to the new operator process up (kopf's startup activity done, from its log):
    #: the part of ``completed_s`` that is the operator's own start (imports, kopf), not the
    #: resume. None: not found in the log.
    operator_up_s: float | None = None
    #: Restart to the change done in the cluster (the retired pod gone and the worker count
    #: reached; the label flipped and the intent removed). None: not within the limit.
    completed_s: float | None = None
    #: Restart to the router serving the result (scale-in: all ready and the router dropped the
    #: pod; switch: the router sees the new role).
    routed_s: float | None = None
    #: After completion: restartCount summed over the deployment's pods (router included), and
    #: pods that are not the objects there before the kill.
    pod_restarts: int | None = None
    pods_replaced: list[str] = field(default_factory=list)
    error: str = ""
    #: Filled by ``account``: the requests whose start falls in this kill's window.
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def done_at(self) -> float:
        """When the change was complete (or, when it never was, the kill)."""
        if self.completed_s is None:
            return self.killed_at
        return self.restarted_at + max(self.completed_s, self.routed_s or 0.0)


def chaos_deployment(name: str, workers: int, prefill: int, role: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fluidpd.io/v1alpha1",
        "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, "workers": workers, "prefill": prefill,
                 "fluidRole": role},
    }  # fmt: skip


@dataclass(slots=True)
class Deployment:
    """A FluidPDDeployment this module made, serving through its router."""

    cp: ControlPlane
    ns: str
    name: str
    url: str
    #: The worker pods at the start: name -> uid.
    first: dict[str, str]

    def pods(self) -> list[dict[str, Any]]:
        return worker_pods(self.cp, self.ns, self.name)

    def pod(self, name: str) -> dict[str, Any]:
        return next(p for p in self.pods() if p["metadata"]["name"] == name)

    def all_pods(self) -> list[dict[str, Any]]:
        """Every pod of the deployment (workers and router), those being deleted included."""
        got = kubectl_json(
            self.cp, "get", "pods", "-n", self.ns, "-l", f"fluidpd.io/deployment={self.name}"
        )
        items: list[dict[str, Any]] = got["items"]
        return items

    def restarts(self) -> dict[str, int]:
        """restartCount of each of the deployment's pods (workers and router) not being deleted."""
        return {
            p["metadata"]["name"]: sum(
                int(c.get("restartCount", 0)) for c in p["status"].get("containerStatuses", [])
            )
            for p in self.all_pods()
            if not p["metadata"].get("deletionTimestamp")
        }

    def replaced(self) -> list[str]:
        """Worker pods that are not the objects there at the start (a new name or a new uid)."""
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods()}
        return sorted(n for n, uid in now.items() if self.first.get(n) != uid)

    def check_pods(self, kill: Kill) -> None:
        """Fills in the kill's pod restarts and replaced pods (after its change completed)."""
        restarts = self.restarts()
        kill.pod_restarts = sum(restarts.values())
        kill.pods_replaced = self.replaced()

    def delete(self) -> None:
        """Deletes it through the running operator (its finalizer), and waits for its pods."""
        self.cp.kubectl("delete", "fpd", self.name, "-n", self.ns, "--timeout=120s")
        # Gone, not only terminating: the next deployment should not share the CPU with them.
        wait_for(lambda: not self.all_pods(), timeout=120, what=f"the pods of {self.name} to go")


def start_deployment(
    cp: ControlPlane, ns: str, name: str, workers: int, prefill: int, role: dict[str, Any]
) -> Deployment:
    apply(cp, ns, chaos_deployment(name, workers, prefill, role))
    wait_ready(cp, ns, name, workers, timeout=240)
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == workers, timeout=60,
             what=f"the router knows {workers}")  # fmt: skip
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(cp, ns, name)}
    return Deployment(cp, ns, name, url, first)


def start_scale_in_deployment(cp: ControlPlane, ns: str, name: str) -> Deployment:
    # wait drain, long outputs: a retiring decode worker takes seconds to empty. A long
    # cooldown keeps FluidRole from switching roles in the middle of the scale-ins.
    role = {"drainMode": "wait", "cooldownSeconds": 600, "intervalSeconds": 1}
    return start_deployment(cp, ns, name, SCALE_FROM, SCALE_FROM // 2, role)


def start_switch_deployment(cp: ControlPlane, ns: str, name: str) -> Deployment:
    # A long cooldown: the policy starts no switch of its own; every switch is one a killed
    # operator left behind.
    role = {"cooldownSeconds": 600, "intervalSeconds": 1}
    return start_deployment(cp, ns, name, SWITCH_WORKERS, SWITCH_WORKERS // 2, role)


def chaos_load(url: str, seed: int, rps: float = 2.0) -> Load:
    """The load both phases run: short prompts, outputs long enough to be in flight at a kill."""
    return Load(url, rps=rps, prompt_len=(100, 400), max_tokens=(100, 250), seed=seed).start()


def _operator_up(operator: Operator, kill: Kill) -> None:
    up = operator.up_since(kill.restarted_at)
    kill.operator_up_s = None if up is None else round(up - kill.restarted_at, 3)


def _kill_when_retiring(
    k8s_api: Any, dep: Deployment, operator: Operator, done: list[str]
) -> tuple[str, float]:
    """Watches the deployment's worker pods; SIGKILLs the operator as soon as one not in
    ``done`` (retired before) carries the retire annotation. Returns that pod's name and the
    time of the kill."""
    core = client.CoreV1Api(k8s_api)
    selector = f"fluidpd.io/deployment={dep.name},app.kubernetes.io/component=worker"
    w = watch.Watch()
    try:
        # Plain JSON, not the client's models: building those took long enough per pod (the
        # watch's first events are every existing pod) that an idle victim, drained at once,
        # was once deleted before the kill landed.
        for ev in w.stream(core.list_namespaced_pod, dep.ns, label_selector=selector,
                           timeout_seconds=120, deserialize=False):  # fmt: skip
            meta = ev["object"]["metadata"]
            gone = meta.get("deletionTimestamp") or meta["name"] in done
            if not gone and RETIRE in (meta.get("annotations") or {}):
                operator.kill()
                return str(meta["name"]), time.time()
    finally:
        w.stop()
    raise TimeoutError("no worker pod got the retire annotation within 120 s")


def scale_in_killed(dep: Deployment, k8s_api: Any, operator: Operator, kills: list[Kill]) -> None:
    """Scales ``dep`` in one worker at a time (``SCALE_TO``), SIGKILLing the operator the moment
    each victim is chosen and restarting it; appends a ``Kill`` per scale-in. Raises
    ``TimeoutError`` when a scale-in does not finish."""
    cp, ns, name = dep.cp, dep.ns, dep.name
    retired: list[str] = []
    current = len(dep.first)
    for n in SCALE_TO:
        cp.kubectl("scale", f"fpd/{name}", "-n", ns, f"--replicas={n}")
        victim, killed_at = _kill_when_retiring(k8s_api, dep, operator, retired)
        kill = Kill("scale-in: retire annotation set", victim, f"{current}->{n}", killed_at)
        kills.append(kill)
        retired.append(victim)
        # With no operator, nobody deletes it: still there means the kill was mid-way.
        kill.mid_way = any(p["metadata"]["name"] == victim for p in dep.pods())
        operator.start()
        kill.restarted_at = time.time()

        def count(n: int = n) -> bool:
            return len(dep.pods()) == n

        def routed(n: int = n) -> bool:
            return len(router_workers(dep.url)) == n

        wait_for(count, timeout=180, what=f"the restarted operator to finish the scale-in to {n}")
        kill.completed_s = time.time() - kill.restarted_at
        _operator_up(operator, kill)
        wait_ready(cp, ns, name, n, timeout=120)
        wait_for(routed, timeout=60, what=f"the router to drop {victim}")
        kill.routed_s = time.time() - kill.restarted_at
        dep.check_pods(kill)
        current = n


def post_role(url: str, token: str, role: str, drain: str, migrate_to: list[str]) -> None:
    """The ``POST /role`` the operator sends a sidecar to start a switch."""
    body = json.dumps({"role": role, "drain": drain, "migrate_to": migrate_to}).encode()
    request = urllib.request.Request(
        f"{url}/role", data=body, method="POST",
        headers={"content-type": "application/json", "Authorization": f"Bearer {token}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as resp:
        if resp.status != 200:
            raise RuntimeError(f"POST {url}/role answered {resp.status}")


def switches_killed(dep: Deployment, operator: Operator, kills: list[Kill]) -> None:
    """Stages each of ``SWITCH_STAGES`` with the operator SIGKILLed first, restarts it and waits
    for it to finish the switch; appends a ``Kill`` per switch. Raises ``TimeoutError`` when a
    switch does not finish."""
    cp, ns, url = dep.cp, dep.ns, dep.url
    token = admin_token(cp, ns, dep.name)
    for stage, source, drain in SWITCH_STAGES:
        seen = router_workers(url)
        pod = sorted(w for w, i in seen.items() if i["role"] == source)[0]
        target = "prefill" if source == "decode" else "decode"
        operator.kill()
        kill = Kill(f"switch: {stage}", pod, f"{source}->{target} ({drain})", time.time())
        kills.append(kill)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cp.kubectl("annotate", "pod", pod, "-n", ns, "--overwrite",
                   f"fluidpd.io/desired-role={target}", f"fluidpd.io/switch-drain={drain}",
                   f"fluidpd.io/switch-started={started}")  # fmt: skip
        if stage != "intent only":
            peers = [i["url"] for w, i in seen.items() if i["role"] == "decode" and w != pod]
            post_role(seen[pod]["url"], token, target, drain, peers)
        if stage == "sidecar done, label stale":

            def finished(p: str = pod, t: str = target) -> bool:
                info = router_workers(url)[p]
                return bool(info["role"] == t and info["state"] == "active")

            wait_for(finished, timeout=120, what=f"{pod} to finish its switch")
        operator.start()
        kill.restarted_at = time.time()

        def flipped(p: str = pod, t: str = target) -> bool:
            meta = dep.pod(p)["metadata"]
            done = meta["labels"]["fluidpd.io/role"] == t
            return done and "fluidpd.io/desired-role" not in meta.get("annotations", {})

        def routed(p: str = pod, t: str = target) -> bool:
            return bool(router_workers(url)[p]["role"] == t)

        wait_for(flipped, timeout=120, what=f"{stage}: the restarted operator to finish")
        kill.completed_s = time.time() - kill.restarted_at
        _operator_up(operator, kill)
        wait_for(routed, timeout=60, what=f"the router to see {pod} as {target}")
        kill.routed_s = time.time() - kill.restarted_at
        dep.check_pods(kill)


def _ok(o: Outcome) -> bool:
    """Completed in full within ``HANG_S`` (one still open at the end is not: it hung)."""
    return o.ok and 0 < o.end - o.start <= HANG_S


def account(outcomes: list[Outcome], kills: list[Kill]) -> None:
    """Gives each kill the requests of its window: those that started after the previous kill's
    change was done (the first: from the start of the load) and before this one's was (the
    last: until the load stopped). Every request lands in exactly one window, so the windows
    add up to the load's totals; ``in_flight_at_kill`` counts those outstanding at the kill
    (they may have started in the window before)."""
    begin = float("-inf")
    for i, kill in enumerate(kills):
        end = float("inf") if i == len(kills) - 1 else kill.done_at
        mine = [o for o in outcomes if begin <= o.start < end]
        hung = [o for o in mine if not o.end or o.end - o.start > HANG_S]
        ok = [o for o in mine if _ok(o)]
        at_kill = [o for o in outcomes if o.start <= kill.killed_at and
                   (not o.end or o.end > kill.killed_at)]  # fmt: skip
        kill.requests = {
            "sent": len(mine),
            "completed": len(ok),
            "failed": len(mine) - len(ok) - len(hung),
            "hung": len(hung),
            "in_flight_at_kill": len(at_kill),
            "in_flight_at_kill_completed": sum(1 for o in at_kill if _ok(o)),
        }
        begin = end
