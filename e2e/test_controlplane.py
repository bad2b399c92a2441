"""The test plane itself: the real API server, RBAC, kube-scheduler and kube-controller-manager,
and the fake kubelet running pods as local processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import ControlPlane, FakeKubelet, wait_for
from harness.controlplane import DEFAULT_NODE, UNPRIVILEGED_USER
from harness.kubelet import _AddressLeases, expand

pytestmark = pytest.mark.k8s

PY = "python"  # the fake kubelet runs this interpreter for it


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _http(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(resp.status), resp.read().decode()


def _pods(core: Any, namespace: str, selector: str = "") -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


def _pod_spec(command: list[str], **extra: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11-slim", "command": command}
    container.update(extra.pop("container", {}))
    return {"containers": [container], "terminationGracePeriodSeconds": 5, **extra}


def _create_pod(core: Any, namespace: str, name: str, spec: dict[str, Any], **meta: Any) -> Any:
    return core.create_namespaced_pod(namespace, {"metadata": {"name": name, **meta}, "spec": spec})


def _web_deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": _pod_spec(
                    [PY, "-m", "http.server", "--bind", "$(POD_IP)", "8080"],
                    container={
                        "env": [
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            }
                        ],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/", "port": "http"},
                            "periodSeconds": 1,
                        },
                    },
                ),
            },
        },
    }


def test_expand_like_kubernetes() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$$(A)", env) == "$(A)"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$(A", env) == "$(A"
    assert expand("a$", env) == "a$"
    assert expand("$x$(A)", env) == "$x1"


def test_pod_addresses_are_not_shared_between_kubelets(tmp_path: Path) -> None:
    first, second = _AddressLeases(tmp_path), _AddressLeases(tmp_path)
    a, b = first.acquire(), first.acquire()
    c = second.acquire()
    assert (a, b) == ("127.0.0.2", "127.0.0.3")
    assert c == "127.0.0.4"
    first.release(a)
    assert second.acquire() == a
    first.release_all()
    second.release_all()


def test_api_server_answers_and_rbac_denies_unprivileged(
    control_plane: ControlPlane, k8s_api: Any
) -> None:
    version = client.VersionApi(k8s_api).get_code()
    assert version.git_version == "v1.36.3"
    names = {ns.metadata.name for ns in client.CoreV1Api(k8s_api).list_namespace().items}
    assert {"default", "kube-system", "kube-node-lease"} <= names

    nobody = control_plane.api_client(control_plane.tokens[UNPRIVILEGED_USER])
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(nobody).list_namespaced_pod("default")
    assert denied.value.status == 403
    nobody.close()
    anonymous = control_plane.api_client("not-a-token")
    with pytest.raises(ApiException) as unauthenticated:
        client.CoreV1Api(anonymous).list_namespace()
    assert unauthenticated.value.status == 401
    anonymous.close()

    kubeconfig = control_plane.write_kubeconfig(
        control_plane.workdir / "nobody.kubeconfig", control_plane.tokens[UNPRIVILEGED_USER]
    )
    can_i = control_plane.kubectl(
        "auth", "can-i", "create", "deployments", kubeconfig=kubeconfig, check=False
    )
    assert can_i.stdout.strip() == "no"
    assert control_plane.kubectl("auth", "can-i", "create", "deployments").stdout.strip() == "yes"
    assert control_plane.helm("list", "--all-namespaces").returncode == 0


def test_node_is_registered_ready_with_gpus(kubelet: FakeKubelet, k8s_api: Any) -> None:
    node = client.CoreV1Api(k8s_api).read_node(DEFAULT_NODE)
    ready = {c.type: c.status for c in node.status.conditions}["Ready"]
    assert ready == "True"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.status.capacity["cpu"] == "64"
    assert not [t for t in node.spec.taints or [] if t.effect == "NoSchedule"]
    lease = client.CoordinationV1Api(k8s_api).read_namespaced_lease(DEFAULT_NODE, "kube-node-lease")
    assert lease.spec.holder_identity == DEFAULT_NODE


def test_deployment_scheduled_run_ready_served_and_replaced(
    control_plane: ControlPlane, kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core, apps = client.CoreV1Api(k8s_api), client.AppsV1Api(k8s_api)
    apps.create_namespaced_deployment(namespace, _web_deployment("web", 2))

    def ready(n: int) -> bool:
        status = apps.read_namespaced_deployment_status("web", namespace).status
        return (status.ready_replicas or 0) == n and (status.replicas or 0) == n

    wait_for(lambda: ready(2), timeout=120, what=lambda: kubelet.dump(namespace))
    pods = _pods(core, namespace, "app=web")
    assert len(pods) == 2
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2
    for pod in pods:
        assert pod.spec.node_name == DEFAULT_NODE
        assert pod.status.pod_ip.startswith("127.")
        assert pod.status.phase == "Running"
        assert pod.status.container_statuses[0].ready
        status, body = _http(f"http://{pod.status.pod_ip}:8080/")
        assert status == 200
        assert "Directory listing" in body
    # `kubectl logs` goes through the API server to the fake kubelet's log endpoint.
    name = pods[0].metadata.name
    logs = control_plane.kubectl("logs", "-n", namespace, name).stdout
    assert f"Serving HTTP on {pods[0].status.pod_ip} port 8080" in logs
    assert "fake-kubelet" not in logs
    assert control_plane.kubectl("logs", "-n", namespace, name, "--tail=1").stdout.count("\n") == 1

    victim = pods[0]
    # The kubelet records the process just after it starts: its output can come first.
    pid = wait_for(
        lambda: kubelet.pid(victim.metadata.name, namespace), timeout=30, what="victim's pid"
    )
    assert _alive(pid)
    core.delete_namespaced_pod(victim.metadata.name, namespace)
    wait_for(lambda: not _alive(pid), timeout=60, what=f"process {pid} to stop")

    def replaced() -> bool:
        names = {p.metadata.name for p in _pods(core, namespace, "app=web")}
        return victim.metadata.name not in names and len(names) == 2 and ready(2)

    wait_for(replaced, timeout=120, what=lambda: kubelet.dump(namespace))
    assert "SIGTERM" in kubelet.logs(victim.metadata.name, namespace)


def test_fluidpd_sidecar_pod_with_role_from_label(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "ROLE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['fluidpd.io/role']"}},
        },
    ]
    command = [
        "fluidpd",
        "sidecar",
        "--id=$(POD_NAME)",
        "--role=$(ROLE)",
        "--host=$(POD_IP)",
        "--port=8000",
        "--url=http://$(POD_IP):8000",
    ]
    spec = _pod_spec(
        command,
        container={
            "image": "fluidpd/sidecar:dev",
            "env": env,
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8000}},
        },
    )
    _create_pod(core, namespace, "worker-0", spec, labels={"fluidpd.io/role": "decode"})

    def ready() -> Any:
        pod = core.read_namespaced_pod("worker-0", namespace)
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        return pod if conditions.get("Ready") == "True" else None

    pod = wait_for(ready, timeout=120, what=lambda: kubelet.dump(namespace))
    status, body = _http(f"http://{pod.status.pod_ip}:8000/role")
    assert status == 200
    assert "decode" in body


def test_crashing_container_restarts_and_restart_count_climbs(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    crash = [PY, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    _create_pod(core, namespace, "crasher", _pod_spec(crash))

    def restarted() -> Any:
        status = core.read_namespaced_pod("crasher", namespace).status
        statuses = status.container_statuses or []
        return statuses[0] if statuses and statuses[0].restart_count >= 2 else None

    container = wait_for(restarted, timeout=120, what=lambda: kubelet.dump(namespace))
    assert container.last_state.terminated.exit_code == 3
    assert kubelet.logs("crasher", namespace).count("boom") >= 3

    # restartPolicy Never / OnFailure: the pod ends Failed / Succeeded.
    _create_pod(core, namespace, "fails", _pod_spec(crash, restartPolicy="Never"))
    done = [PY, "-c", "print('done')"]
    _create_pod(core, namespace, "succeeds", _pod_spec(done, restartPolicy="OnFailure"))
    for name, phase in (("fails", "Failed"), ("succeeds", "Succeeded")):
        wait_for(
            lambda name=name, phase=phase: (
                core.read_namespaced_pod(name, namespace).status.phase == phase
            ),
            timeout=60,
            what=f"{name} {phase}",
        )
    fails = core.read_namespaced_pod("fails", namespace).status.container_statuses[0]
    assert fails.state.terminated.exit_code == 3
    assert fails.restart_count == 0


def test_env_resolution(kubelet: FakeKubelet, k8s_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast", "level": "7"}}
    )
    field = "valueFrom"
    env = [
        {"name": "MY_NAME", field: {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", field: {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MY_UID", field: {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "MY_ROLE", field: {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "MY_NOTE", field: {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
        {"name": "MY_IP", field: {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NODE", field: {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MY_SA", field: {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "TOKEN", field: {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "MODE", field: {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {
            "name": "ABSENT",
            field: {"configMapKeyRef": {"name": "nope", "key": "x", "optional": True}},
        },
        {"name": "GREETING", "value": "hi-$(MY_ROLE)-$$(MY_ROLE)"},
    ]
    script = "import json, os, sys; print('ENV=' + json.dumps(dict(os.environ))); print(sys.argv)"
    spec = _pod_spec(
        [PY, "-c", script, "$(MY_ROLE)", "$$(MY_ROLE)", "$(UNDEFINED)"],
        restartPolicy="Never",
        container={
            "env": env,
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        },
    )
    pod = _create_pod(
        core, namespace, "envy", spec, labels={"role": "prefill"}, annotations={"note": "n1"}
    )
    wait_for(
        lambda: core.read_namespaced_pod("envy", namespace).status.phase == "Succeeded",
        timeout=60,
        what=lambda: kubelet.dump(namespace),
    )
    out = kubelet.logs("envy", namespace)
    line = next(x for x in out.splitlines() if x.startswith("ENV="))
    seen = json.loads(line.removeprefix("ENV="))
    pod_ip = core.read_namespaced_pod("envy", namespace).status.pod_ip
    assert seen["MY_NAME"] == "envy"
    assert seen["MY_NS"] == namespace
    assert seen["MY_UID"] == pod.metadata.uid
    assert seen["MY_ROLE"] == "prefill"
    assert seen["MY_NOTE"] == "n1"
    assert seen["MY_IP"] == pod_ip
    assert seen["MY_NODE"] == DEFAULT_NODE
    assert seen["MY_SA"] == "default"
    assert seen["TOKEN"] == "s3cret"
    assert seen["MODE"] == "fast"
    assert "ABSENT" not in seen
    assert seen["GREETING"] == "hi-prefill-$(MY_ROLE)"
    assert seen["CFG_mode"] == "fast"
    assert seen["CFG_level"] == "7"
    assert seen["HOSTNAME"] == "envy"
    # Not the admin's: the pod's own service-account kubeconfig.
    assert seen["KUBECONFIG"].startswith(str(kubelet.work_dir))
    assert "['-c', 'prefill', '$(MY_ROLE)', '$(UNDEFINED)']" in out


def test_env_is_resolved_again_at_each_restart(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}, "data": {"v": "one"}})
    env = [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "v"}}}]
    script = "import os, time; print('V=' + os.environ['V'], flush=True); time.sleep(0.5)"
    _create_pod(core, namespace, "rerun", _pod_spec([PY, "-c", script], container={"env": env}))
    wait_for(lambda: "V=one" in kubelet.logs("rerun", namespace), timeout=60, what="V=one")
    core.patch_namespaced_config_map("c", namespace, {"data": {"v": "two"}})
    wait_for(
        lambda: "V=two" in kubelet.logs("rerun", namespace),
        timeout=60,
        what=lambda: kubelet.dump(namespace),
    )


def test_config_map_and_secret_volumes_are_mounted_per_pod(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    for name, text in (("one", "first"), ("two", "second")):
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": name}, "data": {"a.yaml": text, "skip": "x"}}
        )
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "key"}, "stringData": {"tls.key": "k3y"}}
    )
    script = (
        "import os, pathlib; d = pathlib.Path('/etc/fpd-test'); "
        "print('FILES=' + ','.join(sorted(p.name for p in d.iterdir())), flush=True); "
        "print('A=' + (d / 'conf.yaml').read_text(), flush=True); "
        "print('KEY=' + pathlib.Path('/etc/fpd-key/tls.key').read_text(), flush=True); "
        "open(d / 'w', 'w')"
    )
    # Two pods mount different data at the same path; each sees its own, read-only.
    for pod, cm in (("mount-one", "one"), ("mount-two", "two")):
        spec = _pod_spec(
            [PY, "-c", script],
            restartPolicy="Never",
            volumes=[
                {"name": "conf", "configMap": {"name": cm, "items": [
                    {"key": "a.yaml", "path": "conf.yaml"}]}},
                {"name": "key", "secret": {"secretName": "key"}},
            ],
            container={"volumeMounts": [
                {"name": "conf", "mountPath": "/etc/fpd-test"},
                {"name": "key", "mountPath": "/etc/fpd-key", "readOnly": True},
            ]},
        )  # fmt: skip
        _create_pod(core, namespace, pod, spec)
    for pod, text in (("mount-one", "first"), ("mount-two", "second")):
        wait_for(
            lambda pod=pod: core.read_namespaced_pod(pod, namespace).status.phase == "Failed",
            timeout=60,
            what=lambda: kubelet.dump(namespace),
        )
        out = kubelet.logs(pod, namespace)
        assert "FILES=conf.yaml" in out and f"A={text}" in out and "KEY=k3y" in out, out
        assert "Read-only file system" in out, out
    # The host's path is not touched by the pods' mounts.
    assert not list(Path("/etc/fpd-test").iterdir())

    # A ConfigMap that does not exist: the pod waits in ContainerCreating with a FailedMount
    # Event, as the kubelet's does (the volume is set up before the sandbox).
    spec = _pod_spec(
        [PY, "-c", "print('ran')"],
        volumes=[{"name": "conf", "configMap": {"name": "absent"}}],
        container={"volumeMounts": [{"name": "conf", "mountPath": "/etc/fpd-test"}]},
    )
    _create_pod(core, namespace, "mount-missing", spec)
    event = wait_for(
        lambda: [e for e in core.list_namespaced_event(namespace).items
                 if e.involved_object.name == "mount-missing" and e.reason == "FailedMount"],
        timeout=60, what="a FailedMount event",
    )[0]  # fmt: skip
    assert event.type == "Warning" and event.source.component == "kubelet"
    assert (
        event.message == 'MountVolume.SetUp failed for volume "conf" : configmap "absent" not found'
    )

    # (The Event is posted before the status is written.)
    def creating() -> bool:
        status = core.read_namespaced_pod("mount-missing", namespace).status
        conditions = {c.type: c.status for c in status.conditions or []}
        return (
            status.phase == "Pending"
            and status.container_statuses[0].state.waiting.reason == "ContainerCreating"
            and conditions["PodReadyToStartContainers"] == "False"
        )

    wait_for(creating, timeout=30, what="Pending in ContainerCreating")
    assert "ran" not in kubelet.logs("mount-missing", namespace)


def test_garbage_collector_deletes_pods_of_a_deleted_owner(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    sleeper = [PY, "-c", "import time; time.sleep(3600)"]
    _create_pod(core, namespace, "owned", _pod_spec(sleeper), ownerReferences=[ref])
    pid = wait_for(lambda: kubelet.pid("owned", namespace), timeout=60, what="owned running")
    core.delete_namespaced_config_map("owner", namespace)

    def gone() -> bool:
        return not _pods(core, namespace)

    wait_for(gone, timeout=120, what="the garbage collector to delete the owned pod")
    wait_for(lambda: not _alive(pid), timeout=30, what=f"process {pid} to stop")


def test_grace_period_then_sigkill(kubelet: FakeKubelet, k8s_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    # The line waited for is not in the command, which the kubelet's start note repeats: the
    # wait would otherwise end before Python had set SIG_IGN, and SIGTERM would kill it.
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring', 'TERM', flush=True); time.sleep(3600)"
    )
    _create_pod(
        core,
        namespace,
        "stubborn",
        _pod_spec([PY, "-c", stubborn], terminationGracePeriodSeconds=1),
    )
    wait_for(
        lambda: "ignoring TERM" in kubelet.logs("stubborn", namespace), timeout=60, what="start"
    )
    # The pod's output can come before the kubelet has recorded the process it started.
    pid = wait_for(lambda: kubelet.pid("stubborn", namespace), timeout=30, what="stubborn's pid")
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for(lambda: not _pods(core, namespace), timeout=60, what="stubborn deleted")
    assert not _alive(pid)
    assert "SIGKILL" in kubelet.logs("stubborn", namespace)


def test_pod_that_cannot_run_locally_stays_pending_with_a_reason(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    spec = {"containers": [{"name": "operator", "image": "ghcr.io/fluidpd/operator:dev"}]}
    _create_pod(core, namespace, "imageonly", spec)
    missing = {"containers": [{"name": "m", "image": "x", "command": ["no-such-binary-here"]}]}
    _create_pod(core, namespace, "missing", missing)
    for name in ("imageonly", "missing"):

        def waiting(name: str = name) -> Any:
            pod = core.read_namespaced_pod(name, namespace)
            statuses = pod.status.container_statuses or []
            state = statuses[0].state.waiting if statuses else None
            return (pod, state) if state is not None and state.reason == "ErrImagePull" else None

        pod, state = wait_for(waiting, timeout=60, what=f"{name} waiting")
        assert pod.status.phase == "Pending"
        assert "fake kubelet" in state.message
    # The kubelet carries on with other pods.
    _create_pod(core, namespace, "fine", _pod_spec([PY, "-c", "print(1)"], restartPolicy="Never"))
    wait_for(
        lambda: core.read_namespaced_pod("fine", namespace).status.phase == "Succeeded",
        timeout=60,
        what="fine Succeeded",
    )


def test_node_identity_is_limited_by_the_node_authorizer(
    control_plane: ControlPlane, kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "unrelated"}})
    node = control_plane.api_client(control_plane.tokens[f"system:node:{DEFAULT_NODE}"])
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(node).read_namespaced_secret("unrelated", namespace)
    assert denied.value.status == 403
    node.close()


def test_service_account_kubeconfig_acts_under_the_pods_rbac(
    control_plane: ControlPlane, kubelet: FakeKubelet, k8s_api: Any, namespace: str
) -> None:
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "visible"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "read-configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-configmaps",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    kubectl = str(control_plane.bin_dir / "kubectl")
    script = (
        f"{kubectl} get configmap visible -o name && "
        f"{kubectl} auth whoami -o jsonpath='{{.status.userInfo.username}}{{\"\\n\"}}' && "
        f"! {kubectl} get secrets"
    )
    spec = _pod_spec(["sh", "-c", script], restartPolicy="Never", serviceAccountName="reader")
    _create_pod(core, namespace, "as-reader", spec)
    wait_for(
        lambda: core.read_namespaced_pod("as-reader", namespace).status.phase == "Succeeded",
        timeout=60,
        what=lambda: kubelet.dump(namespace),
    )
    out = kubelet.logs("as-reader", namespace)
    assert "configmap/visible" in out
    assert f"system:serviceaccount:{namespace}:reader" in out
    assert "forbidden" in out


_KILLED_RUN = """
import sys, time
from kubernetes import client
from harness import ControlPlane, FakeKubelet
from pathlib import Path
cp = ControlPlane(Path(sys.argv[1]), workdir=Path(sys.argv[2])).start()
kubelet = FakeKubelet(cp).start()
core = client.CoreV1Api(cp.api_client())
command = ["sh", "-c", "sleep 600 & sleep 600"]
spec = {"containers": [{"name": "m", "image": "i", "command": command}]}
core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": spec})
while kubelet.pid("p", "default") is None:
    time.sleep(0.2)
print(*[p.pid for p in cp.procs.values()], kubelet.pid("p", "default"), flush=True)
time.sleep(600)
"""


def _group_alive(pgid: int) -> bool:
    """Any live process in process group pgid."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


def test_nothing_outlives_a_killed_test_run(control_plane: ControlPlane, tmp_path: Path) -> None:
    """SIGKILL the process running a plane and a pod: components and pod processes (with the
    pod's own children) all go."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    run = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(control_plane.bin_dir), str(tmp_path / "plane")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert run.stdout is not None
    pids = [int(p) for p in run.stdout.readline().split()]
    assert len(pids) == 5, "the plane did not come up"
    components, pod = pids[:4], pids[4]
    assert _group_alive(pod)
    run.send_signal(signal.SIGKILL)
    run.wait()
    wait_for(
        lambda: not any(_alive(p) for p in components) and not _group_alive(pod),
        timeout=60,
        what="the components and the pod's processes to die",
    )
