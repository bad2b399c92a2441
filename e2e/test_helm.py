"""The Helm chart on the real test API server: ``helm install`` creates the CRD, RBAC, peering and
the operator Deployment; the operator, run with the chart's own arguments and its
ServiceAccount's token (least-privilege RBAC), serves a FluidPDDeployment; ``helm uninstall``
removes everything the release created.

The fake kubelet cannot give a pod in-cluster credentials (their path is fixed), so the chart is
installed with ``operator.replicas=0`` and the test runs the operator container's exact command
line as a local process with a kubeconfig holding the ServiceAccount's token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import ControlPlane, FakeKubelet, wait_for
from harness.controlplane import KubectlError

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


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    cp = control_plane
    # A CRD applied outside Helm (by another test module) would make the install refuse it.
    crd = cp.kubectl("get", "crd", CRD, "--ignore-not-found", "-o", "json").stdout
    if crd and "meta.helm.sh/release-name" not in crd:
        cp.kubectl("delete", "crd", CRD, "--wait=true", "--timeout=120s")
    cp.helm("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace",
            "--set", "crds.keep=false", "--set", "operator.replicas=0",
            "--set", "grafana.dashboards.enabled=true")  # fmt: skip
    manifest = cp.helm("get", "manifest", RELEASE, "-n", SYSTEM).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    yield docs
    if cp.helm("status", RELEASE, "-n", SYSTEM, check=False).returncode == 0:
        cp.helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", check=False)


def test_install_creates_crd_rbac_and_operator(
    control_plane: ControlPlane, release: list[dict[str, Any]]
) -> None:
    cp = control_plane
    kinds = {(d["kind"], d["metadata"]["name"]) for d in release}
    assert ("CustomResourceDefinition", CRD) in kinds
    assert any(k == "Deployment" and n.endswith("operator") for k, n in kinds)
    assert any(k == "ClusterRole" for k, _ in kinds) and any(
        k == "ServiceAccount" for k, _ in kinds
    )
    assert any(k == "ConfigMap" for k, _ in kinds), "dashboard ConfigMaps"
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    # kopf's peering CRDs come from the chart's crds/ (installed first, never templated).
    for name in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        assert _exists(cp, "crd", name, None), name
    for d in release:
        ns = d["metadata"].get("namespace") or (SYSTEM if d["kind"] not in _CLUSTER_KINDS else None)
        assert _exists(cp, _kind_ref(d), d["metadata"]["name"], ns), (d["kind"], d["metadata"])


_CLUSTER_KINDS = {
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "Namespace",
}


def _operator_command(release: list[dict[str, Any]]) -> tuple[list[str], str, dict[str, str]]:
    """The chart's operator command line (the shell wrapper's ``$@``), its ServiceAccount and
    its plain env values."""
    dep = next(
        d
        for d in release
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("operator")
    )
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    argv = [*c.get("command", []), *c.get("args", [])]
    # /bin/sh -c 'exec fluidpd operator --priority "$(shuf ...)" "$@"' $0 args...
    wrapped = argv[:2] == ["/bin/sh", "-c"]
    argv = ["operator", "--priority", "7", *argv[4:]] if wrapped else argv[1:]
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return argv, pod["serviceAccountName"], env


def test_operator_runs_with_the_charts_rbac(
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
    release: list[dict[str, Any]],
    namespace: str,
    tmp_path: Path,
) -> None:
    cp = control_plane
    argv, sa, chart_env = _operator_command(release)
    live, metrics = _free_port(), _free_port()
    argv = [
        a.replace("0.0.0.0:8080", f"127.0.0.1:{live}") if a.startswith("http") else a for a in argv
    ]
    argv[argv.index("--metrics-port") + 1] = str(metrics)
    # Least privilege: the ServiceAccount may do what the operator needs, and nothing else.
    who = f"--as=system:serviceaccount:{SYSTEM}:{sa}"
    can = lambda *a: cp.kubectl("auth", "can-i", *a, who, check=False).stdout.strip()  # noqa: E731
    assert can("patch", "fluidpddeployments.fluidpd.io/status", "-n", namespace) == "yes"
    assert can("create", "pods", "-n", namespace) == "yes"
    assert can("delete", "pods", "-n", namespace) == "yes"
    assert can("create", "events", "-n", namespace) == "yes"
    assert can("get", "secrets", "-n", namespace) == "yes"
    assert can("list", "secrets", "-n", namespace) == "no"
    assert can("delete", "fluidpddeployments.fluidpd.io", "-n", namespace) == "no"
    assert can("create", "clusterrolebindings") == "no"
    assert can("delete", "nodes") == "no"

    token = cp.kubectl("create", "token", sa, "-n", SYSTEM, "--duration=1h").stdout.strip()
    kubeconfig = cp.write_kubeconfig(tmp_path / "operator.kubeconfig", token, "fluidpd-operator")
    env = dict(os.environ, **chart_env, KUBECONFIG=str(kubeconfig))
    log = tmp_path / "operator.log"
    exe = Path(sys.executable).with_name("fluidpd")
    with log.open("wb") as out:
        proc = subprocess.Popen([str(exe), *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{live}/healthz", timeout=2).status == 200
            ),
            timeout=60,
            what=lambda: f"the operator's liveness endpoint\n{log.read_text()[-3000:]}",
        )
        doc = {
            "apiVersion": "fluidpd.io/v1alpha1",
            "kind": "FluidPDDeployment",
            "metadata": {"name": "helm-sim"},
            "spec": {"model": {"name": "llama-3.1-8b"}, "workers": 2},
        }
        cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

        def ready() -> bool:
            got = json.loads(cp.kubectl("get", "fpd", "helm-sim", "-n", namespace,
                                        "-o", "json").stdout)  # fmt: skip
            conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        wait_for(ready, timeout=150, what=lambda: f"Ready\n{log.read_text()[-3000:]}")
        # The worker pods run the image the chart told the operator to use.
        selector = "app.kubernetes.io/component=worker"
        pods = json.loads(
            cp.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        )
        images = {p["spec"]["containers"][0]["image"] for p in pods["items"]}
        assert images == {chart_env["FLUIDPD_SIDECAR_IMAGE"]}
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
        assert f'fluidpd_deployment="helm-sim",fluidpd_namespace="{namespace}"'.encode() in text
    finally:
        # While the operator runs: its finalizer must come off before the CRD can go.
        cp.kubectl("delete", "fpd", "--all", "-n", namespace, "--timeout=90s", check=False)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(log.read_text()[-4000:])


def test_uninstall_removes_everything(
    control_plane: ControlPlane, release: list[dict[str, Any]]
) -> None:
    cp = control_plane
    cp.helm("uninstall", RELEASE, "-n", SYSTEM, "--wait")

    def gone() -> bool:
        for d in release:
            ns = d["metadata"].get("namespace") or (
                SYSTEM if d["kind"] not in _CLUSTER_KINDS else None
            )
            if _exists(cp, _kind_ref(d), d["metadata"]["name"], ns):
                return False
        return True

    wait_for(gone, timeout=120, what="every object of the release to be deleted")
    with pytest.raises(KubectlError):
        cp.kubectl("get", "crd", CRD)
