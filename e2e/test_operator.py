"""The operator on the real test control plane: kubectl apply / get / scale, an in-place role
switch driven by load through the router, an operator killed mid-drain, validation of bad
objects, and the capacity fallback out and back in.

Each test runs its own ``fluidpd operator --namespace <ns>`` process against the shared plane;
the fake kubelet runs the worker and router pods as local sidecar and router processes.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import ControlPlane, wait_for
from harness.controlplane import KubectlError
from harness.load import MODEL, Load
from harness.operator import (
    Operator,
    apply,
    condition,
    events,
    kubectl_json,
    router_url,
    router_workers,
    status,
    wait_ready,
    worker_pods,
)

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[1]
ROLE = "fluidpd.io/role"


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fluidpd.io/v1alpha1",
        "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": MODEL}, **spec},
    }


def restarts(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["restartCount"])


# -- tests ------------------------------------------------------------------------------------
def test_apply_get_and_scale(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    doc = yaml.safe_load((ROOT / "examples" / "sim-4p4d.yaml").read_text())
    doc["spec"] |= {"workers": 4, "prefill": 2}
    apply(cp, ns, doc)
    name = doc["metadata"]["name"]
    wait_ready(cp, ns, name, 4)
    pods = worker_pods(cp, ns, name)
    roles = sorted(p["metadata"]["labels"][ROLE] for p in pods)
    assert roles == ["decode", "decode", "prefill", "prefill"]
    for p in pods:
        owner = p["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == (
            "FluidPDDeployment", name, True,
        )  # fmt: skip
    services = {s["metadata"]["name"]: s for s in kubectl_json(cp, "get", "svc", "-n", ns)["items"]}
    assert {f"{name}-prefill", f"{name}-decode", f"{name}-router"} <= set(services)
    assert services[f"{name}-prefill"]["spec"]["selector"][ROLE] == "prefill"
    router = kubectl_json(cp, "get", "deploy", f"{name}-router", "-n", ns)
    assert router["metadata"]["ownerReferences"][0]["name"] == name
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 4, timeout=30, what="the router knows 4 workers")

    table = cp.kubectl("get", "fpd", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "P", "D", "PPI", "DPI", "READY", "AGE"], table
    assert table[1].split()[:6] == [name, "2", "2", "0", "0", "4/4"], table

    # The scale subresource: kubectl scale (what HPA and KEDA use too).
    cp.kubectl("scale", f"fpd/{name}", "-n", ns, "--replicas=5")
    wait_ready(cp, ns, name, 5)
    path = f"/apis/fluidpd.io/v1alpha1/namespaces/{ns}/fluidpddeployments/{name}/scale"
    scale = json.loads(cp.kubectl("get", "--raw", path).stdout)
    assert scale["spec"]["replicas"] == 5 and scale["status"]["replicas"] == 5
    assert "fluidpd.io/deployment=" + name in scale["status"]["selector"]
    wait_for(lambda: len(router_workers(url)) == 5, timeout=30, what="the router follows")

    cp.kubectl("scale", f"fpd/{name}", "-n", ns, "--replicas=3")
    wait_for(lambda: len(worker_pods(cp, ns, name)) == 3, timeout=120, what="scale-in to 3")
    wait_ready(cp, ns, name, 3)
    left = worker_pods(cp, ns, name)
    assert {p["metadata"]["labels"][ROLE] for p in left} == {"prefill", "decode"}
    assert events(cp, ns, "WorkerRemoved")
    wait_for(lambda: len(router_workers(url)) == 3, timeout=30, what="the router drops them")


def _switching_deployment(name: str, **extra: Any) -> dict[str, Any]:
    # A long cooldown: one switch per test, whatever the load does afterwards.
    role = {"nPersist": 2, "windowSeconds": 2, "cooldownSeconds": 600, "intervalSeconds": 1}
    return deployment(name, workers=4, prefill=1, fluidRole=role | extra)


def _long_prompts(url: str, duration_s: float, **kw: Any) -> Load:
    # Long prompts at a rate one prefill worker cannot sustain: its queue's PPI climbs.
    args: dict[str, Any] = {"rps": 12.0, "prompt_len": (3000, 6000), "max_tokens": (2, 8)}
    return Load(url, duration_s=duration_s, **(args | kw))


def test_workload_shift_switches_a_worker_in_place(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns, name = control_plane, namespace, "shift"
    apply(cp, ns, _switching_deployment(name))
    wait_ready(cp, ns, name, 4)
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 4, timeout=30, what="the router knows 4 workers")
    before = {p["metadata"]["name"]: p for p in worker_pods(cp, ns, name)}

    with _long_prompts(url, 30.0) as load:
        done = wait_for(lambda: events(cp, ns, "SwitchCompleted"), timeout=90,
                        what="a SwitchCompleted event")  # fmt: skip
        switched = done[0]["involvedObject"]["name"]
        st = wait_for(
            lambda: (s := status(cp, ns, name)).get("lastSwitch", {}).get("pod") == switched and s,
            timeout=30,
            what="the status to record the switch",
        )
        after = {p["metadata"]["name"]: p for p in worker_pods(cp, ns, name)}
        router_view = router_workers(url)[switched]
    summary = load.summary()
    assert before[switched]["metadata"]["labels"][ROLE] == "decode"
    pod = after[switched]
    # In place: the same pod object and process, its label flipped.
    assert pod["metadata"]["uid"] == before[switched]["metadata"]["uid"]
    assert restarts(pod) == restarts(before[switched]) == 0
    assert pod["metadata"]["labels"][ROLE] == "prefill"
    assert "fluidpd.io/desired-role" not in pod["metadata"].get("annotations", {})
    # The per-role Service follows the label; the router follows the sidecar.
    assert router_view["role"] == "prefill"
    started = events(cp, ns, "SwitchStarted")
    # Taken by the predictive rule (issue #14): the forecast from the router's arrivals and
    # the workers' profile is the switch's stated reason.
    assert started and all("forecast bottleneck" in e["message"] for e in started), started
    assert not events(cp, ns, "SwitchResumed")  # nothing to take over: the operator never left
    assert (st["prefill"], st["decode"]) == (2, 2)
    assert st["lastSwitch"]["to"] == "prefill"
    # No request lost to the switch.
    assert summary["hung"] == 0
    assert summary["completed"] == summary["sent"], summary


def test_operator_killed_mid_drain_completes_the_switch(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns, name = control_plane, namespace, "restart"
    # wait drain: the decode worker finishes its in-flight (long) outputs before switching.
    apply(cp, ns, _switching_deployment(name, drainMode="wait"))
    wait_ready(cp, ns, name, 4)
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 4, timeout=30, what="the router knows 4 workers")

    def draining() -> str | None:
        # The router's view first (one cheap HTTP call), then the intent on the pod.
        for worker, info in router_workers(url).items():
            if info.get("state") == "drain":
                pod = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == worker)
                if pod["metadata"].get("annotations", {}).get("fluidpd.io/desired-role"):
                    return worker
        return None

    def decode_busy() -> bool:
        decode = [w for w in router_workers(url).values() if w.get("role") == "decode"]
        return len(decode) == 3 and all(int(w.get("batch", 0)) >= 2 for w in decode)

    long_outputs = Load(url, duration_s=50.0, rps=2.0, prompt_len=(100, 300),
                                  max_tokens=(300, 500), seed=1)  # fmt: skip
    with long_outputs:
        # Long outputs on every decode worker before prefill pressure builds: the victim is the
        # cheapest to drain, and one with nothing in flight would drain within a single poll.
        wait_for(decode_busy, timeout=30, what="long outputs on every decode worker")
        with _long_prompts(url, 40.0) as load:
            victim = wait_for(
                draining, timeout=90, what="a worker draining for a switch", interval=0.2
            )
            operator.kill()
            uid = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == victim)[
                "metadata"
            ]["uid"]
            # With nobody to flip it, the label stays while the sidecar finishes on its own.
            wait_for(lambda: router_workers(url)[victim]["role"] == "prefill", timeout=120,
                     what="the sidecar to finish its switch")  # fmt: skip
            pod = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == victim)
            assert pod["metadata"]["labels"][ROLE] == "decode"
            operator.start()

            def flipped() -> bool:
                p = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == victim)
                return p["metadata"]["labels"][ROLE] == "prefill" and not p["metadata"].get(
                    "annotations", {}
                ).get("fluidpd.io/desired-role")

            wait_for(flipped, timeout=60, what="the restarted operator to finish the switch")
    pod = next(p for p in worker_pods(cp, ns, name) if p["metadata"]["name"] == victim)
    assert pod["metadata"]["uid"] == uid and restarts(pod) == 0
    assert events(cp, ns, "SwitchResumed") and events(cp, ns, "SwitchCompleted")
    wait_for(lambda: condition(status(cp, ns, name), "Progressing") == "False", timeout=30,
             what="nothing left in progress")  # fmt: skip
    for s in (load.summary(), long_outputs.summary()):
        assert s["hung"] == 0 and s["completed"] == s["sent"], s


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"slo": {"ttftSeconds": 0}}, "spec.slo.ttftSeconds"),
        ({"slo": {"tpotSeconds": -1}}, "spec.slo.tpotSeconds"),
        ({"workers": 2, "minPrefill": 2, "minDecode": 1},
         "minPrefill + minDecode must not exceed workers"),
        ({"engine": {"backend": "vllm"}}, 'Unsupported value: "vllm"'),
        ({"fluidToken": {"eta": -0.5}}, "spec.fluidToken.eta"),
        ({"fluidRole": {"ppiLow": 2.0, "ppiHigh": 1.0}},
         "fluidRole.ppiLow must not exceed fluidRole.ppiHigh"),
        ({"autoscaling": {"enabled": True, "maxWorkers": 4}, "workers": 8},
         "autoscaling.maxWorkers must be at least workers"),
        ({"fluidRole": {"drainMode": "abort"}}, 'Unsupported value: "abort"'),
        ({"model": {"name": MODEL, "source": {
            "hostPath": {"path": "/m"}, "persistentVolumeClaim": {"claimName": "w"}}}},
         "model.source: set exactly one of persistentVolumeClaim or hostPath"),
        ({"model": {"name": MODEL, "source": {}}},
         "model.source: set exactly one of persistentVolumeClaim or hostPath"),
        ({"model": {"name": MODEL, "source": {"hostPath": {"path": "models/tiny"}}}},
         "model.source.hostPath.path must be an absolute path"),
        ({"model": {"name": MODEL, "source": {"hostPath": {"path": "/m/../etc"}}}},
         "model.source.hostPath.path must be an absolute path without '..'"),
        ({"model": {"name": MODEL, "source": {"hostPath": {"path": "/m", "type": "File"}}}},
         'spec.model.source.hostPath.type: Unsupported value: "File"'),
        ({"model": {"name": MODEL, "source": {"persistentVolumeClaim": {"claimName": ""}}}},
         "spec.model.source.persistentVolumeClaim.claimName: Invalid value"),
        ({"model": {"name": MODEL, "source": {"persistentVolumeClaim": {"claimName": "Bad_Name"}}}},
         "spec.model.source.persistentVolumeClaim.claimName: Invalid value"),
        ({"model": {"name": MODEL, "source": {"persistentVolumeClaim": {
            "claimName": "w", "subPath": "../up"}}}},
         "subPath must be a relative path without '..'"),
        ({"engine": {"backend": "gpu", "kvTransfer": "sim"}},
         "engine.kvTransfer: the gpu backend hands off real KV; use shm or mooncake"),
        ({"engine": {"backend": "sim", "kvTransfer": "cuda-ipc"}},
         "engine.kvTransfer: cuda-ipc needs backend gpu"),
        ({"engine": {"backend": "gpu", "kvTransfer": "cuda-ipc", "hostNamespaces": False}},
         "engine.kvTransfer: cuda-ipc needs hostNamespaces"),
    ],
)  # fmt: skip
def test_invalid_objects_are_rejected(
    control_plane: ControlPlane, crd: None, namespace: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubectlError) as err:
        apply(control_plane, namespace, deployment("bad", **spec))
    assert message in err.value.stderr, err.value.stderr
    assert 'The FluidPDDeployment "bad" is invalid' in err.value.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_examples_are_valid_for_the_api_server(
    control_plane: ControlPlane, crd: None, namespace: str, example: str
) -> None:
    # Server-side dry run: every object of the file is defaulted, validated (OpenAPI, CEL) and
    # admitted by the real API server, and nothing is stored.
    out = control_plane.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(ROOT / "examples" / example)
    ).stdout
    assert "fluidpddeployment.fluidpd.io/" in out and "(server dry run)" in out, out


def test_cuda_ipc_worker_pods_get_the_nodes_ipc_and_pid_namespaces(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    """``kvTransfer: cuda-ipc``: the API server stores worker pods with hostIPC and hostPID (the
    workers open each other's CUDA IPC handles and check each other's pids). No GPU here: the
    pods' sidecars cannot start; only the objects the operator made are checked."""
    cp, ns, name = control_plane, namespace, "ipc"
    apply(cp, ns, deployment(name, workers=2, prefill=1,
                             engine={"backend": "gpu", "kvTransfer": "cuda-ipc"}))  # fmt: skip

    def two() -> list[dict[str, Any]] | None:
        pods = worker_pods(cp, ns, name)
        return pods if len(pods) == 2 else None

    pods = wait_for(two, timeout=90, what="the operator to create 2 worker pods")
    for pod in pods:
        assert (pod["spec"].get("hostIPC"), pod["spec"].get("hostPID")) == (True, True), pod
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--kv-transfer") + 1] == "cuda-ipc"


def test_workers_use_the_profile_config_map(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns, name = control_plane, namespace, "profiled"
    # A shipped profile with a KV capacity no shipped profile has: the workers can only report
    # it if they read the ConfigMap mounted at the path the operator passes them.
    doc = yaml.safe_load((ROOT / "profiles" / "llama-3.1-8b-a100-80gb.yaml").read_text())
    doc["kv"]["capacity_tokens"] = 123_456
    cp.kubectl("create", "configmap", "my-profile", "-n", ns,
               f"--from-literal=profile.yaml={yaml.safe_dump(doc)}")  # fmt: skip
    apply(cp, ns, deployment(name, workers=2, prefill=1, model={
        "name": MODEL, "profileConfigMap": "my-profile"}))  # fmt: skip
    wait_ready(cp, ns, name, 2)
    for pod in worker_pods(cp, ns, name):
        ip = pod["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8100/pressure", timeout=5) as resp:
            assert json.loads(resp.read())["kv_capacity"] == 123_456, pod["metadata"]["name"]


def test_sglang_backend_makes_workers_and_a_bad_one_is_not_ready(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    """``backend: sglang`` is no longer refused (no Degraded, no UnsupportedBackend): workers
    are created with ``--engine sglang``. Without a model directory their sidecar exits at once
    with a one-line error, so the pods stay NotReady instead of hanging. (A Ready sglang
    deployment with real SGLang servers: e2e/test_sglang_backend.py.)"""
    cp, ns, name = control_plane, namespace, "sgl"
    apply(cp, ns, deployment(name, workers=2, prefill=1, engine={"backend": "sglang"}))
    pods = wait_for(lambda: worker_pods(cp, ns, name) if len(worker_pods(cp, ns, name)) == 2
                    else None, timeout=60, what="two sglang worker pods")  # fmt: skip
    for pod in pods:
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--engine") + 1] == "sglang"
        # The operator's default image for sglang workers: SGLang with FluidPD's sidecar.
        assert pod["spec"]["containers"][0]["image"] == "ghcr.io/fluidpd/sglang-worker:0.1.0"

    def exited() -> list[dict[str, Any]] | None:
        got = worker_pods(cp, ns, name)
        done = [
            cs
            for pod in got
            for cs in pod["status"].get("containerStatuses", [])
            if (cs.get("lastState") or {}).get("terminated", {}).get("exitCode", 0) != 0
        ]
        return got if len(done) == 2 else None

    for pod in wait_for(exited, timeout=90, what="both sidecars exited non-zero"):
        ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
        assert not ready or ready[0]["status"] != "True", pod["metadata"]["name"]
    assert not events(cp, ns, "UnsupportedBackend")
    for c in status(cp, ns, name).get("conditions", []):
        if c["type"] == "Degraded":
            assert "engine.backend" not in str(c.get("message", ""))


def test_capacity_fallback_scales_out_and_back_in(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns, name = control_plane, namespace, "fallback"
    apply(cp, ns, deployment(
        name, workers=2, prefill=1,
        fluidRole={"nPersist": 2, "windowSeconds": 2, "intervalSeconds": 1},
        autoscaling={"enabled": True, "maxWorkers": 3, "scaleOutAfterSeconds": 3,
                     "scaleInAfterSeconds": 6},
    ))  # fmt: skip
    wait_ready(cp, ns, name, 2)
    url = router_url(cp, ns, name)
    wait_for(lambda: len(router_workers(url)) == 2, timeout=30, what="the router knows 2 workers")

    # 1P1D: FluidRole cannot move a worker (a pool of one spares none), so prefill pressure is
    # needs-capacity, and the fallback adds a worker of the more pressured phase.
    with _long_prompts(url, 25.0, rps=10.0) as heavy:
        wait_for(lambda: events(cp, ns, "ScaledOut"), timeout=90, what="a ScaledOut event")
        wait_ready(cp, ns, name, 3)
        assert status(cp, ns, name)["autoscaledWorkers"] == 1
        wait_for(lambda: len(router_workers(url)) == 3, timeout=30, what="the router follows")
    assert heavy.summary()["hung"] == 0
    # Light load while it scales back in: nothing may be dropped by the removal.
    with Load(url, duration_s=30.0, rps=1.0, prompt_len=(100, 400),
                        max_tokens=(20, 60), seed=2) as light:  # fmt: skip
        wait_for(lambda: events(cp, ns, "WorkerRemoved"), timeout=90, what="a WorkerRemoved")
        wait_for(lambda: len(worker_pods(cp, ns, name)) == 2, timeout=60, what="2 workers again")
    summary = light.summary()
    assert summary["hung"] == 0 and summary["completed"] == summary["sent"], summary
    st = status(cp, ns, name)
    assert st["autoscaledWorkers"] == 0
    assert condition(st, "CapacityExhausted") == "False"
    # Never above maxWorkers.
    assert max(len(worker_pods(cp, ns, name)), st["workers"]) <= 3
