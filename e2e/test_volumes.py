"""The fake kubelet's hostPath and PersistentVolumeClaim volumes on the real test control plane.

No provisioner runs on the plane: each test provisions statically (it creates the PV itself);
kube-controller-manager's PV controller binds claims to volumes, kube-scheduler refuses to place
a pod whose claim is unbound, and the fake kubelet follows a bound claim to its volume's
hostPath or local directory and bind-mounts it, read-only where asked.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import FakeKubelet, wait_for
from harness.controlplane import DEFAULT_NODE

pytestmark = pytest.mark.k8s

PY = "python"
#: Where the probe pods mount their volume (the host's path stays an empty mount point).
TARGET = "/mnt/fluidpd-e2e-data"
#: Prints what the pod sees at TARGET (files, one file's text) and whether it can write there.
PROBE = (
    f"import pathlib; d = pathlib.Path('{TARGET}'); "
    "print('FILES=' + ','.join(sorted(p.name for p in d.iterdir())), flush=True); "
    "print('TEXT=' + (d / 'config.json').read_text(), flush=True)\n"
    "try:\n    (d / 'written').write_text('x'); print('WRITE=ok', flush=True)\n"
    "except OSError as e:\n    print('WRITE=' + e.strerror, flush=True)"
)


def _probe_pod(name: str, volume: dict[str, Any], mount: dict[str, Any], **spec: Any) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": "python:3.11-slim", "command": [PY, "-c", PROBE],
                "volumeMounts": [{"name": "data", "mountPath": TARGET, **mount}],
            }],
            "volumes": [{"name": "data", **volume}],
            **spec,
        },
    }  # fmt: skip


def _model_files(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(text)
    (root / "model.safetensors").write_bytes(b"\0" * 16)
    return root


def _finished(core: Any, ns: str, name: str, kubelet: FakeKubelet) -> str:
    wait_for(
        lambda: core.read_namespaced_pod(name, ns).status.phase in ("Succeeded", "Failed"),
        timeout=60,
        what=lambda: f"{name} to finish\n{kubelet.dump(ns)}",
    )
    return kubelet.logs(name, ns)


def _failed_mount(core: Any, ns: str, pod: str) -> list[str]:
    return [
        e.message
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == pod and e.reason == "FailedMount"
    ]


def _creating(core: Any, ns: str, pod: str) -> bool:
    """Pending in ContainerCreating without a sandbox, as the kubelet shows a volume wait."""
    status = core.read_namespaced_pod(pod, ns).status
    waiting = status.container_statuses[0].state.waiting if status.container_statuses else None
    conditions = {c.type: c.status for c in status.conditions or []}
    return (
        status.phase == "Pending"
        and waiting is not None
        and waiting.reason == "ContainerCreating"
        and conditions.get("PodReadyToStartContainers") == "False"
    )


def _pv(name: str, source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            **source,
            **spec,
        },
    }


def _pvc(name: str, volume_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadOnlyMany"],
        "storageClassName": "",
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume_name:
        spec["volumeName"] = volume_name
    return {"metadata": {"name": name}, "spec": spec}


def test_host_path_read_only_and_read_write(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s_api)
    src = _model_files(tmp_path / "model", '{"arch": "llama"}')
    volume = {"hostPath": {"path": str(src), "type": "Directory"}}
    core.create_namespaced_pod(namespace, _probe_pod("ro", volume, {"readOnly": True}))
    core.create_namespaced_pod(namespace, _probe_pod("rw", volume, {}))
    out = _finished(core, namespace, "ro", kubelet)
    assert "FILES=config.json,model.safetensors" in out and 'TEXT={"arch": "llama"}' in out, out
    assert "WRITE=Read-only file system" in out, out
    out = _finished(core, namespace, "rw", kubelet)
    assert "WRITE=ok" in out, out
    # A read-write hostPath writes through to the node's directory, as it does on a node; the
    # mount itself stays inside each pod's mount namespace.
    assert (src / "written").read_text() == "x"
    assert not list(Path(TARGET).iterdir())


def test_host_path_type_checks(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s_api)
    missing = tmp_path / "not-yet"
    not_dir = tmp_path / "plain-file"
    not_dir.write_text("x")
    cases = {
        "want-dir": (missing, "Directory", f"{missing} is not a directory"),
        "file-not-dir": (not_dir, "Directory", f"{not_dir} is not a directory"),
        "dir-not-file": (tmp_path, "File", f"{tmp_path} is not a file"),
        "dir-not-socket": (tmp_path, "Socket", f"{tmp_path} is not a socket file"),
    }
    for pod, (path, kind, _) in cases.items():
        volume = {"hostPath": {"path": str(path), "type": kind}}
        core.create_namespaced_pod(namespace, _probe_pod(pod, volume, {"readOnly": True}))
    for pod, (_, _, message) in cases.items():
        got = wait_for(lambda pod=pod: _failed_mount(core, namespace, pod), timeout=60,
                       what=f"a FailedMount event on {pod}")  # fmt: skip
        assert got == [
            f'MountVolume.SetUp failed for volume "data" : hostPath type check failed: {message}'
        ]
        wait_for(
            lambda pod=pod: _creating(core, namespace, pod), timeout=30, what="ContainerCreating"
        )
        assert "FILES=" not in kubelet.logs(pod, namespace)
    # The kubelet retries: once the directory exists, the waiting pod runs.
    _model_files(missing, "later")
    out = _finished(core, namespace, "want-dir", kubelet)
    assert "TEXT=later" in out, out

    # The *OrCreate types make what is missing: a directory 0755, a file 0644.
    made_dir, made_file = tmp_path / "made" / "dir", tmp_path / "made-file"
    for pod, path, kind in (("mkdir", made_dir, "DirectoryOrCreate"),
                            ("mkfile", made_file, "FileOrCreate")):  # fmt: skip
        spec = _probe_pod(pod, {"hostPath": {"path": str(path), "type": kind}}, {})
        spec["spec"]["containers"][0]["command"] = [PY, "-c", "print('started', flush=True)"]
        core.create_namespaced_pod(namespace, spec)
        assert "started" in _finished(core, namespace, pod, kubelet)
    assert stat.S_ISDIR(made_dir.stat().st_mode) and stat.S_IMODE(made_dir.stat().st_mode) == 0o755
    assert made_file.is_file() and stat.S_IMODE(made_file.stat().st_mode) == 0o644


def test_claim_bound_to_a_static_volume_is_mounted_read_only(
    kubelet: FakeKubelet,
    k8s_api: Any,
    namespace: str,
    tmp_path: Path,
    persistent_volumes: list[str],
) -> None:
    core = client.CoreV1Api(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    host_src = _model_files(tmp_path / "host" / "tiny", "on a hostPath PV")
    local_src = _model_files(tmp_path / "local", "on a local PV")
    affinity = {
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": [DEFAULT_NODE],
                            }
                        ]
                    }
                ]
            }
        }
    }
    host_pv, local_pv = f"host-{suffix}", f"local-{suffix}"
    core.create_persistent_volume(
        _pv(host_pv, {"hostPath": {"path": str(host_src.parent), "type": "Directory"}})
    )
    core.create_persistent_volume(_pv(local_pv, {"local": {"path": str(local_src)}}, **affinity))
    persistent_volumes += [host_pv, local_pv]
    core.create_namespaced_persistent_volume_claim(namespace, _pvc("models", host_pv))
    core.create_namespaced_persistent_volume_claim(namespace, _pvc("local", local_pv))
    for claim in ("models", "local"):
        wait_for(
            lambda claim=claim: core.read_namespaced_persistent_volume_claim(
                claim, namespace).status.phase == "Bound",
            timeout=60, what=f"the PV controller to bind {claim}",
        )  # fmt: skip

    # The claim's readOnly makes the mount read-only even when the mount itself does not say so.
    by_claim = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    core.create_namespaced_pod(namespace, _probe_pod("claim-ro", by_claim, {"subPath": "tiny"}))
    core.create_namespaced_pod(
        namespace,
        _probe_pod(
            "local-ro", {"persistentVolumeClaim": {"claimName": "local"}}, {"readOnly": True}
        ),
    )
    out = _finished(core, namespace, "claim-ro", kubelet)
    assert "FILES=config.json,model.safetensors" in out and "TEXT=on a hostPath PV" in out, out
    assert "WRITE=Read-only file system" in out, out
    out = _finished(core, namespace, "local-ro", kubelet)
    assert "TEXT=on a local PV" in out and "WRITE=Read-only file system" in out, out
    assert not (host_src / "written").exists() and not (local_src / "written").exists()


def test_unbound_claim_leaves_the_pod_waiting_until_it_binds(
    kubelet: FakeKubelet,
    k8s_api: Any,
    namespace: str,
    tmp_path: Path,
    persistent_volumes: list[str],
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_persistent_volume_claim(namespace, _pvc("later"))
    claim = {"persistentVolumeClaim": {"claimName": "later"}}
    # Through kube-scheduler: it does not place a pod whose claim is unbound.
    core.create_namespaced_pod(namespace, _probe_pod("scheduled", claim, {"readOnly": True}))
    # Bound to the node directly (as a static pod or a bypassed scheduler would be): the
    # kubelet itself refuses to start it until the claim binds.
    core.create_namespaced_pod(
        namespace, _probe_pod("direct", claim, {"readOnly": True}, nodeName=DEFAULT_NODE)
    )

    def unschedulable() -> str | None:
        for c in core.read_namespaced_pod("scheduled", namespace).status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                return f"{c.reason}: {c.message}"
        return None

    reason = wait_for(unschedulable, timeout=60, what="PodScheduled=False")
    assert reason.startswith("Unschedulable") and "unbound" in reason, reason
    wanted = (
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], "
        f"failed to process volumes=[data]: error processing PVC {namespace}/later: "
        f'PVC {namespace}/later has non-bound phase ("Pending") or empty pvc.Spec.VolumeName ("")'
    )
    # (Possibly after one saying the node may not read the claim yet: the node authorizer
    # learns of a new pod's claims a moment after the pod is written.)
    wait_for(
        lambda: wanted in _failed_mount(core, namespace, "direct"),
        timeout=60,
        what=lambda: f"the FailedMount event: {_failed_mount(core, namespace, 'direct')}",
    )
    wait_for(lambda: _creating(core, namespace, "direct"), timeout=30, what="ContainerCreating")

    # Static provisioning: a matching PV appears, the PV controller binds, both pods run.
    src = _model_files(tmp_path / "late", "bound at last")
    pv = f"late-{uuid.uuid4().hex[:6]}"
    core.create_persistent_volume(_pv(pv, {"hostPath": {"path": str(src)}}, claimRef={
        "namespace": namespace, "name": "later"}))  # fmt: skip
    persistent_volumes.append(pv)
    for pod in ("direct", "scheduled"):
        out = _finished(core, namespace, pod, kubelet)
        assert "TEXT=bound at last" in out and "WRITE=Read-only file system" in out, out


def test_claim_on_a_volume_the_fake_kubelet_cannot_mount_says_so(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str, persistent_volumes: list[str]
) -> None:
    core = client.CoreV1Api(k8s_api)
    pv = f"nfs-{uuid.uuid4().hex[:6]}"
    core.create_persistent_volume(_pv(pv, {"nfs": {"server": "10.0.0.9", "path": "/models"}}))
    persistent_volumes.append(pv)
    core.create_namespaced_persistent_volume_claim(namespace, _pvc("remote", pv))
    claim = {"persistentVolumeClaim": {"claimName": "remote"}}
    core.create_namespaced_pod(namespace, _probe_pod("remote", claim, {"readOnly": True}))
    # (An earlier FailedMount may say the node may not read the PV yet: the node authorizer
    # learns of the claim's binding a moment after the PV controller makes it.)
    wanted = "mounts only hostPath and local PersistentVolumes, not ['nfs']"
    wait_for(
        lambda: any(wanted in m for m in _failed_mount(core, namespace, "remote")),
        timeout=90,
        what=lambda: (
            f"a FailedMount event saying {wanted}: {_failed_mount(core, namespace, 'remote')}"
        ),
    )
    wait_for(lambda: _creating(core, namespace, "remote"), timeout=30, what="ContainerCreating")


def test_missing_sub_path_is_created_like_the_kubelet(
    kubelet: FakeKubelet, k8s_api: Any, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s_api)
    root = tmp_path / "vol"
    root.mkdir()
    volume = {"hostPath": {"path": str(root), "type": "Directory"}}
    spec = _probe_pod("sub", volume, {"subPathExpr": "$(POD_NAME)/out"})
    container = spec["spec"]["containers"][0]
    container["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.name"}}}]  # fmt: skip
    container["command"] = [PY, "-c", f"open('{TARGET}/hello', 'w').write('hi'); print('done')"]
    core.create_namespaced_pod(namespace, spec)
    assert "done" in _finished(core, namespace, "sub", kubelet)
    assert (root / "sub" / "out" / "hello").read_text() == "hi"
    assert os.listdir(root) == ["sub"]
