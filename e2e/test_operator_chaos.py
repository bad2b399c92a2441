"""The operator SIGKILLed in the middle of scale-ins and of role switches, again and again, on
the real test control plane under load through the router: after each restart the scale-in or
the switch completes, no pod restarts, no request is lost.

Scale-in: the kill lands the moment a worker pod gets its ``fluidpd.io/retire`` annotation (a
watch on the pods, not a poll): the operator has decided the scale-in and may or may not have
asked the sidecar to drain yet; the restarted operator must finish it from what is in the
cluster.

Switches: the three points where an operator can die in one (``test_operator.py`` has a
load-driven kill mid-drain): the intent is on the pod and the sidecar was never asked; the
sidecar is draining; the sidecar has finished but the pod's label is stale. Each is staged the
way the operator leaves it (its ``fluidpd.io/desired-role`` annotation, then the same
``POST /role`` it sends), with the operator SIGKILLed first.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client, watch

from fluidpd.drills.load import LoadReport, OpenLoopLoad
from harness import ControlPlane, wait_for
from harness.operator import (
    Operator,
    admin_token,
    apply,
    events,
    kubectl_json,
    router_url,
    router_workers,
    wait_ready,
    worker_pods,
)

pytestmark = pytest.mark.k8s

MODEL = "llama-3.1-8b"
RETIRE = "fluidpd.io/retire"


class Load:
    """Open-loop load through the router in a thread, until stopped."""

    def __init__(self, url: str, **kw: Any) -> None:
        self.load = OpenLoopLoad(url, MODEL, **kw)
        self.report: LoadReport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> LoadReport:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            return await self.load.run(3600.0, self._stop)

        self.report = asyncio.run(main())

    def start(self) -> None:
        self.thread.start()
        self._started.wait(10)

    def stop(self) -> dict[str, Any]:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(180)
        assert self.report is not None, "the load never finished"
        return self.report.summary(120.0)


def _kill_when_retiring(
    k8s_api: Any, ns: str, name: str, operator: Operator, done: list[str]
) -> str:
    """Watches the deployment's worker pods; SIGKILLs the operator as soon as one not in
    ``done`` (retired before) carries the retire annotation. Returns that pod's name."""
    core = client.CoreV1Api(k8s_api)
    selector = f"fluidpd.io/deployment={name},app.kubernetes.io/component=worker"
    w = watch.Watch()
    try:
        for ev in w.stream(core.list_namespaced_pod, ns, label_selector=selector,
                           timeout_seconds=120):  # fmt: skip
            pod = ev["object"]
            gone = pod.metadata.deletion_timestamp or pod.metadata.name in done
            if not gone and RETIRE in (pod.metadata.annotations or {}):
                operator.kill()
                return str(pod.metadata.name)
    finally:
        w.stop()
    raise AssertionError("no worker pod got the retire annotation within 120 s")


def test_operator_killed_mid_scale_in_repeatedly(
    control_plane: ControlPlane, operator: Operator, namespace: str, k8s_api: Any
) -> None:
    cp, ns, name = control_plane, namespace, "chaos-scale"
    # wait drain, long outputs: a retiring decode worker takes seconds to empty. A long
    # cooldown keeps FluidRole from switching roles in the middle of the scale-ins.
    role = {"drainMode": "wait", "cooldownSeconds": 600, "intervalSeconds": 1}
    doc = {
        "apiVersion": "fluidpd.io/v1alpha1",
        "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, "workers": 6, "prefill": 3, "fluidRole": role},
    }
    apply(cp, ns, doc)
    wait_ready(cp, ns, name, 6, timeout=240)
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 6, timeout=60, what="the router knows 6")
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(cp, ns, name)}

    load = Load(url, rps=2.0, prompt_len=(100, 400), max_tokens=(100, 250), seed=5)
    load.start()
    retired: list[str] = []
    mid_way: list[bool] = []
    try:
        for n in (5, 4, 3):
            cp.kubectl("scale", f"fpd/{name}", "-n", ns, f"--replicas={n}")
            victim = _kill_when_retiring(k8s_api, ns, name, operator, retired)
            retired.append(victim)
            # With no operator, nobody deletes it: still there means the kill was mid-way.
            mid_way.append(any(p["metadata"]["name"] == victim for p in worker_pods(cp, ns, name)))
            operator.start()

            def count(n: int = n) -> bool:
                return len(worker_pods(cp, ns, name)) == n

            def routed(n: int = n) -> bool:
                return len(router_workers(url)) == n

            wait_for(
                count, timeout=180, what=f"the restarted operator to finish the scale-in to {n}"
            )
            wait_ready(cp, ns, name, n, timeout=120)
            wait_for(routed, timeout=60, what=f"the router to drop {victim}")
    finally:
        summary = load.stop()
    print(f"retired {retired}; operator killed before the deletion: {mid_way}; load {summary}")
    assert all(mid_way), (retired, mid_way)
    assert len(set(retired)) == 3
    left = worker_pods(cp, ns, name)
    # Only the retired workers went; the others are the same pods, never restarted.
    assert {p["metadata"]["name"] for p in left} == set(first) - set(retired)
    for p in left:
        assert p["metadata"]["uid"] == first[p["metadata"]["name"]]
        assert int(p["status"]["containerStatuses"][0]["restartCount"]) == 0
    assert {p["metadata"]["labels"]["fluidpd.io/role"] for p in left} == {"prefill", "decode"}
    assert len(events(cp, ns, "WorkerRemoved")) >= 3
    deployment = kubectl_json(cp, "get", "fpd", name, "-n", ns)
    assert deployment["status"]["workers"] == 3
    # Nothing lost to three interrupted scale-ins.
    assert summary["hung"] == 0
    assert summary["completed"] == summary["sent"], summary


def _post_role(url: str, token: str, role: str, drain: str, migrate_to: list[str]) -> None:
    body = json.dumps({"role": role, "drain": drain, "migrate_to": migrate_to}).encode()
    request = urllib.request.Request(
        f"{url}/role", data=body, method="POST",
        headers={"content-type": "application/json", "Authorization": f"Bearer {token}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def test_operator_killed_mid_switch_repeatedly(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns, name = control_plane, namespace, "chaos-switch"
    # A long cooldown: the policy starts no switch of its own; every switch here is one a
    # killed operator left behind.
    role = {"cooldownSeconds": 600, "intervalSeconds": 1}
    doc = {
        "apiVersion": "fluidpd.io/v1alpha1",
        "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, "workers": 4, "prefill": 2, "fluidRole": role},
    }
    apply(cp, ns, doc)
    wait_ready(cp, ns, name, 4, timeout=240)
    url = router_url(cp, ns, name)
    token = admin_token(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 4, timeout=60, what="the router knows 4")
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(cp, ns, name)}

    def label(pod: str) -> str:
        p = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == pod)
        return str(p["metadata"]["labels"]["fluidpd.io/role"])

    load = Load(url, rps=2.0, prompt_len=(100, 400), max_tokens=(100, 250), seed=6)
    load.start()
    stages = ("intent only", "sidecar draining", "sidecar done, label stale")
    switched: list[str] = []
    try:
        for stage, source, drain in zip(stages, ("decode", "prefill", "decode"),
                                        ("migrate", "wait", "migrate"), strict=True):  # fmt: skip
            seen = router_workers(url)
            pod = sorted(w for w, i in seen.items() if i["role"] == source)[0]
            target = "prefill" if source == "decode" else "decode"
            operator.kill()
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            cp.kubectl("annotate", "pod", pod, "-n", ns, "--overwrite",
                       f"fluidpd.io/desired-role={target}", f"fluidpd.io/switch-drain={drain}",
                       f"fluidpd.io/switch-started={started}")  # fmt: skip
            if stage != "intent only":
                peers = [i["url"] for w, i in seen.items() if i["role"] == "decode" and w != pod]
                _post_role(seen[pod]["url"], token, target, drain, peers)
            if stage == "sidecar done, label stale":

                def finished(p: str = pod, t: str = target) -> bool:
                    info = router_workers(url)[p]
                    return bool(info["role"] == t and info["state"] == "active")

                wait_for(finished, timeout=120, what=f"{pod} to finish its switch")
            operator.start()

            def flipped(p: str = pod, t: str = target) -> bool:
                got = next(x for x in worker_pods(cp, ns, name) if x["metadata"]["name"] == p)
                meta = got["metadata"]
                done = meta["labels"]["fluidpd.io/role"] == t
                return done and "fluidpd.io/desired-role" not in meta.get("annotations", {})

            wait_for(flipped, timeout=120, what=f"{stage}: the restarted operator to finish")
            assert router_workers(url)[pod]["role"] == target and label(pod) == target
            switched.append(f"{pod} {source}->{target} ({stage})")
    finally:
        summary = load.stop()
    print(f"switches finished after an operator kill: {switched}; load {summary}")
    assert len(events(cp, ns, "SwitchResumed")) >= 3
    assert len(events(cp, ns, "SwitchCompleted")) >= 3
    for p in worker_pods(cp, ns, name):
        assert p["metadata"]["uid"] == first[p["metadata"]["name"]]
        assert int(p["status"]["containerStatuses"][0]["restartCount"]) == 0
    assert summary["hung"] == 0
    assert summary["completed"] == summary["sent"], summary
