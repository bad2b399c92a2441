"""The FluidPD operator on the test plane: a ``fluidpd operator`` process for one namespace, and
the kubectl reads the operator's e2e tests share (objects, status, conditions, router pods)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from fluidpd import procs
from harness.controlplane import ControlPlane
from harness.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml"


def install_crd(cp: ControlPlane) -> None:
    cp.kubectl("apply", "--server-side", "-f", str(CRD))
    cp.wait_established("fluidpddeployments.fluidpd.io")


class Operator:
    """A ``fluidpd operator`` process watching one namespace."""

    def __init__(self, cp: ControlPlane, namespace: str, log: Path) -> None:
        self.cp = cp
        self.namespace = namespace
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cp.kubeconfig), FLUIDPD_RESYNC_SECONDS="5")
        exe = Path(sys.executable).with_name("fluidpd")
        argv = [str(exe), "operator", "--namespace", self.namespace, "--standalone"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*argv, "--log-level", "info"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, like a node failure."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop([self.proc], 20)
            self.proc = None

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl(*args, "-o", "json").stdout)


def apply(cp: ControlPlane, namespace: str, doc: dict[str, Any]) -> None:
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))


def worker_pods(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    got = kubectl_json(
        cp, "get", "pods", "-n", ns, "-l", f"fluidpd.io/deployment={name},"
        "app.kubernetes.io/component=worker",
    )  # fmt: skip
    items: list[dict[str, Any]] = got["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    st: dict[str, Any] = kubectl_json(cp, "get", "fpd", name, "-n", ns).get("status", {})
    return st


def condition(st: dict[str, Any], type_: str) -> str | None:
    for c in st.get("conditions", []):
        if c["type"] == type_:
            return str(c["status"])
    return None


def wait_ready(cp: ControlPlane, ns: str, name: str, workers: int, timeout: float = 150) -> None:
    def ready() -> bool:
        st = status(cp, ns, name)
        return st.get("readyWorkers") == workers and condition(st, "Ready") == "True"

    wait_for(ready, timeout=timeout, what=f"{name}: {workers} ready workers and Ready=True")


def router_url(cp: ControlPlane, ns: str, name: str) -> str:
    def find() -> str | None:
        pods = kubectl_json(
            cp, "get", "pods", "-n", ns, "-l",
            f"fluidpd.io/deployment={name},app.kubernetes.io/component=router",
        )["items"]  # fmt: skip
        for p in pods:
            ip = p.get("status", {}).get("podIP")
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
            if ip and ready:
                return f"http://{ip}:8000"
        return None

    url: str = wait_for(find, timeout=90, what="a ready router pod")
    _TOKENS[url] = admin_token(cp, ns, name)
    return url


#: The admin token of each router URL ``router_url`` found, for ``router_workers`` (every
#: ``/admin/*`` route takes it; callers then need only the URL).
_TOKENS: dict[str, str] = {}


def admin_token(cp: ControlPlane, ns: str, name: str) -> str:
    """The bearer token the operator generated for a deployment (its ``<name>-auth`` Secret)."""
    secret = kubectl_json(cp, "get", "secret", f"{name}-auth", "-n", ns)
    return base64.b64decode(secret["data"]["token"]).decode()


def router_workers(url: str) -> dict[str, dict[str, Any]]:
    request = urllib.request.Request(f"{url}/admin/stats")
    if url in _TOKENS:
        request.add_header("Authorization", f"Bearer {_TOKENS[url]}")
    with urllib.request.urlopen(request, timeout=5) as resp:
        stats = json.loads(resp.read())
    return {w["worker"]: w for w in stats["workers"]}


def events(cp: ControlPlane, ns: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(cp, "get", "events", "-n", ns)["items"]
    return [e for e in items if e.get("reason") == reason]
