"""The Helm chart on the real test API server: ``helm install`` creates the CRD, RBAC, peering and
the operator Deployment; the operator pod, under its ServiceAccount (least-privilege RBAC),
serves a FluidPDDeployment; ``helm uninstall`` removes everything the release created.

The fake kubelet runs the chart's operator pod like any other: its container command as a local
process, with a kubeconfig holding a token bound to the pod's ServiceAccount (the fake kubelet's
stand-in for in-cluster credentials), so the operator works under the chart's RBAC.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import ControlPlane, FakeKubelet, wait_for
from harness.controlplane import KubectlError
from harness.operator import install_crd

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "fluidpd"
RELEASE, SYSTEM = "fluidpd", "fluidpd-system"
CRD = "fluidpddeployments.fluidpd.io"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _exists(cp: ControlPlane, kind: str, name: str, namespace: str | None) -> bool:
    ns = ["-n", namespace] if namespace else []
    proc = cp.kubectl("get", kind, name, *ns, "--ignore-not-found", "-o", "name", check=False)
    return bool(proc.stdout.strip())


def _kind_ref(doc: dict[str, Any]) -> str:
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    kind = doc["kind"].lower()
    return f"{kind}.{group}" if group else kind


@dataclass
class Release:
    docs: list[dict[str, Any]]
    liveness_port: int
    metrics_port: int


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, kubelet: FakeKubelet) -> Iterator[Release]:
    cp = control_plane
    # A CRD applied outside Helm (by another test module) would make the install refuse it.
    crd = cp.kubectl("get", "crd", CRD, "--ignore-not-found", "-o", "json").stdout
    if crd and "meta.helm.sh/release-name" not in crd:
        cp.kubectl("delete", "crd", CRD, "--wait=true", "--timeout=120s")
    # The fake kubelet runs pods on the host's network namespace: free ports, not 8080/9090.
    live, metrics = _free_port(), _free_port()
    cp.helm("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace",
            "--set", "crds.keep=false", "--set", "grafana.dashboards.enabled=true",
            "--set", f"operator.livenessPort={live}",
            "--set", f"operator.metrics.port={metrics}")  # fmt: skip
    manifest = cp.helm("get", "manifest", RELEASE, "-n", SYSTEM).stdout
    yield Release([d for d in yaml.safe_load_all(manifest) if d], live, metrics)
    if cp.helm("status", RELEASE, "-n", SYSTEM, check=False).returncode == 0:
        cp.kubectl("delete", "fpd", "--all", "-A", "--timeout=90s", check=False)
        cp.helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", check=False)
    # The uninstall took the CRD with it; the worker's later modules rely on the session's
    # ``crd`` fixture, which installs it once, so it is put back as that fixture left it.
    install_crd(cp)


def test_install_creates_crd_rbac_and_operator(
    control_plane: ControlPlane, release: Release
) -> None:
    cp = control_plane
    kinds = {(d["kind"], d["metadata"]["name"]) for d in release.docs}
    assert ("CustomResourceDefinition", CRD) in kinds
    assert any(k == "Deployment" and n.endswith("operator") for k, n in kinds)
    assert any(k == "ClusterRole" for k, _ in kinds) and any(
        k == "ServiceAccount" for k, _ in kinds
    )
    assert any(k == "ConfigMap" for k, _ in kinds), "dashboard ConfigMaps"
    cp.wait_established(CRD)
    # kopf's peering CRDs come from the chart's crds/ (installed first, never templated).
    for name in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        assert _exists(cp, "crd", name, None), name
    for d in release.docs:
        ns = d["metadata"].get("namespace") or (SYSTEM if d["kind"] not in _CLUSTER_KINDS else None)
        assert _exists(cp, _kind_ref(d), d["metadata"]["name"], ns), (d["kind"], d["metadata"])


_CLUSTER_KINDS = {
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "Namespace",
}


def _operator(release: Release) -> tuple[str, dict[str, str]]:
    """The chart's operator ServiceAccount and its container's plain env values."""
    dep = next(
        d
        for d in release.docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("operator")
    )
    pod = dep["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0].get("env", []) if "value" in e}
    return pod["serviceAccountName"], env


def test_operator_pod_serves_a_deployment_with_least_privilege(
    control_plane: ControlPlane, kubelet: FakeKubelet, release: Release, namespace: str
) -> None:
    """The chart's operator pod (run by the fake kubelet under its ServiceAccount's own token,
    so under the chart's RBAC) serves a FluidPDDeployment in another namespace."""
    cp = control_plane
    sa, chart_env = _operator(release)
    who = f"--as=system:serviceaccount:{SYSTEM}:{sa}"

    def can(*a: str) -> str:
        return cp.kubectl("auth", "can-i", *a, who, check=False).stdout.strip()

    assert can("patch", "fluidpddeployments.fluidpd.io/status", "-n", namespace) == "yes"
    assert can("create", "pods", "-n", namespace) == "yes"
    assert can("delete", "pods", "-n", namespace) == "yes"
    assert can("create", "events", "-n", namespace) == "yes"
    assert can("get", "secrets", "-n", namespace) == "yes"
    assert can("list", "secrets", "-n", namespace) == "no"
    assert can("delete", "fluidpddeployments.fluidpd.io", "-n", namespace) == "no"
    assert can("create", "clusterrolebindings") == "no"
    assert can("delete", "nodes") == "no"

    pods = lambda: kubelet.dump(SYSTEM)  # noqa: E731
    live = f"http://127.0.0.1:{release.liveness_port}/healthz"
    wait_for(lambda: urllib.request.urlopen(live, timeout=2).status == 200, timeout=90,
             what=lambda: f"the operator pod's liveness endpoint\n{pods()}")  # fmt: skip
    doc = {
        "apiVersion": "fluidpd.io/v1alpha1",
        "kind": "FluidPDDeployment",
        "metadata": {"name": "helm-sim"},
        "spec": {"model": {"name": "llama-3.1-8b"}, "workers": 2},
    }
    try:
        cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

        def ready() -> bool:
            got = json.loads(
                cp.kubectl("get", "fpd", "helm-sim", "-n", namespace, "-o", "json").stdout
            )
            conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        wait_for(ready, timeout=150, what=lambda: f"Ready\n{pods()}")
        # The worker pods run the image the chart told the operator to use.
        selector = "app.kubernetes.io/component=worker"
        got = json.loads(
            cp.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        )
        images = {p["spec"]["containers"][0]["image"] for p in got["items"]}
        assert images == {chart_env["FLUIDPD_SIDECAR_IMAGE"]}
        metrics = f"http://127.0.0.1:{release.metrics_port}/metrics"
        text = urllib.request.urlopen(metrics, timeout=5).read()
        assert f'fluidpd_deployment="helm-sim",fluidpd_namespace="{namespace}"'.encode() in text
    finally:
        # While the operator runs: its finalizer must come off before the CRD can go.
        cp.kubectl("delete", "fpd", "--all", "-n", namespace, "--timeout=90s", check=False)


def test_uninstall_removes_everything(control_plane: ControlPlane, release: Release) -> None:
    cp = control_plane
    cp.helm("uninstall", RELEASE, "-n", SYSTEM, "--wait")

    def gone() -> bool:
        for d in release.docs:
            ns = d["metadata"].get("namespace") or (
                SYSTEM if d["kind"] not in _CLUSTER_KINDS else None
            )
            if _exists(cp, _kind_ref(d), d["metadata"]["name"], ns):
                return False
        return True

    wait_for(gone, timeout=120, what="every object of the release to be deleted")
    with pytest.raises(KubectlError):
        cp.kubectl("get", "crd", CRD)
