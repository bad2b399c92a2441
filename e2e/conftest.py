"""Fixtures for the e2e tests on the real test control plane.

- `control_plane` (session): a `harness.ControlPlane` (etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler on loopback); `.kubectl(...)`, `.api_client()`,
  `.kubeconfig`, `.server`, `.token`, `.tokens`, `.bin_dir`.
- `kubelet` (session): a `harness.FakeKubelet` on that plane (node `fluidpd-fake-node`);
  `.logs(pod)`, `.dump(namespace)`, `.pod_ip(pod, ns)`, `.pid(pod, ns)`.
- `namespace` (function): a fresh namespace (its `default` ServiceAccount ready), deleted after
  the test (waiting until its pods are gone, not for the namespace object itself).
- `k8s_api` (session): an admin `kubernetes.client.ApiClient`.
- `persistent_volumes` (function): append the names of PVs a test creates; deleted after it.
- `crd` (session): the FluidPDDeployment CRD installed and Established.
- `operator` (function): a `harness.operator.Operator` (``fluidpd operator --namespace <ns>``
  process) for the test's namespace; every FluidPDDeployment in it is deleted afterwards while
  it still runs, and its log is printed (shown when the test fails).

A failing test that used `kubelet` gets the pod output (and the control plane's log tails) in its
report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import ControlPlane, FakeKubelet, ensure_binaries
from harness.binaries import CONTROL_PLANE
from harness.namespace import create_namespace, delete_namespace
from harness.operator import Operator, install_crd


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane(ensure_binaries(CONTROL_PLANE)) as cp:
        yield cp


@pytest.fixture(scope="session")
def kubelet(control_plane: ControlPlane) -> Iterator[FakeKubelet]:
    with FakeKubelet(control_plane) as k:
        yield k


@pytest.fixture(scope="session")
def k8s_api(control_plane: ControlPlane) -> Iterator[Any]:
    api = control_plane.api_client()
    yield api
    api.close()


@pytest.fixture
def namespace(k8s_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    name = create_namespace(k8s_api, request.node.name)
    yield name
    delete_namespace(k8s_api, name)


@pytest.fixture
def persistent_volumes(k8s_api: Any) -> Iterator[list[str]]:
    """Names of PersistentVolumes the test made, deleted after it (they are cluster-scoped: the
    namespace's deletion leaves them)."""
    names: list[str] = []
    yield names
    core = client.CoreV1Api(k8s_api)
    for name in names:
        try:
            core.delete_persistent_volume(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="session")
def crd(control_plane: ControlPlane) -> None:
    install_crd(control_plane)


@pytest.fixture
def operator(
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
    crd: None,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Operator]:
    op = Operator(control_plane, namespace, tmp_path / "operator.log")
    op.start()
    yield op
    op.delete_all_and_stop()
    # Captured by pytest: shown only when the test fails.
    print(f"--- operator log ---\n{op.tail()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    kubelet = funcargs.get("kubelet")
    if isinstance(kubelet, FakeKubelet):
        report.sections.append(
            ("fake kubelet: pod output", kubelet.dump(funcargs.get("namespace")))
        )
    control_plane = funcargs.get("control_plane")
    if isinstance(control_plane, ControlPlane):
        report.sections.append(("control plane logs", control_plane.logs(2000)))
