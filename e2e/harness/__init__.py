"""The e2e test plane: a real Kubernetes control plane on loopback and a fake kubelet.

- `binaries.ensure_binaries()` builds (once, cached) and finds kube-apiserver,
  kube-controller-manager, kube-scheduler, kubectl, etcd and helm.
- `controlplane.ControlPlane` runs etcd + kube-apiserver + kube-controller-manager +
  kube-scheduler as local processes, with RBAC, service-account keys and an admin kubeconfig.
- `kubelet.FakeKubelet` registers one Node and runs the first container of every pod bound to it
  as a local process on its own 127.0.0.x address, writing the pod status as a kubelet would.
- `wait.wait_for(probe, timeout=...)` polls until probe returns something truthy.
- `python -m harness.cluster` (`make cluster`) runs both until Ctrl-C.
- `python -m harness.drill_operator` SIGKILLs the operator mid scale-in and mid-switch, round
  after round, and writes JSON (issue #15; `operator_chaos` holds the steps it shares with
  e2e/test_operator_chaos.py).
"""

from harness.binaries import ensure_binaries
from harness.controlplane import ControlPlane
from harness.kubelet import FakeKubelet
from harness.wait import wait_for

__all__ = ["ControlPlane", "FakeKubelet", "ensure_binaries", "wait_for"]
