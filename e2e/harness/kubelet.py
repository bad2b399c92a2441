"""A fake kubelet: one Node whose pods run as local processes on their own loopback addresses.

It registers the Node `fluidpd-fake-node` (Ready; 64 CPUs, 256Gi, 110 pods, 8 nvidia.com/gpu),
keeps its Lease and Ready heartbeat fresh, and for every pod bound to it runs the pod's FIRST
container's `command + args` as a local process:

- each pod gets its own address 127.0.0.N (N from 2 up, reused after the pod is gone; held
  under a file lock, so concurrent test sessions on one machine never share one);
  `hostNetwork` pods get 127.0.0.1;
- env is resolved as the real kubelet does: `value` (with `$(VAR)` expansion), `valueFrom`
  fieldRef / resourceFieldRef / secretKeyRef / configMapKeyRef, and `envFrom`; `$(VAR)` in
  command and args is expanded the Kubernetes way (`$$` escapes, unknown refs stay as written);
  the process inherits this process's environment underneath, minus KUBECONFIG, with this
  interpreter's bin dir first on PATH;
- a container that mounts the service-account token gets KUBECONFIG pointing at a kubeconfig
  with a token bound to the pod (TokenRequest), so API clients in it act as the pod's
  ServiceAccount (in-cluster config itself can't work: nothing is at /var/run/secrets);
- `fluidpd` (or any path ending in /fluidpd) runs the `fluidpd` of this interpreter's bin dir,
  `python`/`python3` run this interpreter, anything else runs if found on PATH; with no command,
  `image_entrypoints` (image repository -> entrypoint) may supply one; otherwise the container
  stays Waiting with reason ErrImagePull and a message saying why; `image_env` (image
  repository -> env, e.g. an images/ Dockerfile's ENV via `harness.images`) is what the image
  sets, under the container's env;
- the pod status is written as the kubelet writes it (phase, podIP(s), hostIP, startTime,
  conditions, containerStatuses); readiness comes from the readinessProbe (httpGet, tcpSocket,
  grpc as TCP, exec) polled every 0.5 s, or from the process running when there is none;
- exits are handled per restartPolicy (restartCount, lastState, CrashLoopBackOff with a short
  backoff, env resolved again at each start); Never/OnFailure end in Succeeded/Failed;
- a deleted pod's process group gets SIGTERM, SIGKILL after the grace period (capped at 10 s),
  then the pod is deleted with grace 0 and a UID precondition.

Volumes (`harness.volumes`) are set up and mounted as the kubelet does: ConfigMap and Secret
under the pod's directory, hostPath in place after its `type` check, a
persistentVolumeClaim through its bound PersistentVolume (hostPath or local source); each
volumeMount (with subPath/subPathExpr) is bind-mounted at its mountPath, read-only where the
mount, the claim or the kind says so, in a private mount namespace of the container's process
(`unshare --mount`; root only), so two pods can mount different data at the same path. A volume
that can't be set up (a missing ConfigMap, a failed type check, an unbound claim) leaves the
pod Pending in ContainerCreating (PodReadyToStartContainers=False) with a FailedMount Warning
Event in the real kubelet's words, retried every 2 s.

Only the first container runs; the others are reported Waiting (reason NotRunLocally) and do
not count toward readiness. Liveness and startup probes, init containers, emptyDir, projected
and other volume kinds (not set up: the process sees the host's path), and `kubectl
exec/attach` are not implemented; `kubectl logs` is served (see `_start_log_server`), and
`logs(pod)` reads the same.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from harness import procs, volumes
from harness.controlplane import DEFAULT_NODE
from harness.expansion import expand

if TYPE_CHECKING:
    from harness.controlplane import ControlPlane

log = logging.getLogger("fluidpd.e2e.kubelet")

Obj = dict[str, Any]
T = TypeVar("T")

SYNC_PERIOD = 0.5
HEARTBEAT_PERIOD = 10.0
MAX_GRACE = 10.0
MAX_BACKOFF = 8.0
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

DEFAULT_CAPACITY: Mapping[str, str] = {
    "cpu": "64",
    "memory": "256Gi",
    "pods": "110",
    "nvidia.com/gpu": "8",
    "ephemeral-storage": "1Ti",
}


class ConfigError(Exception):
    """The container's configuration can't be resolved yet (a missing secret, key, field)."""


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def parse_quantity(text: str) -> float:
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ConfigError(f"bad quantity {text!r}")
    value = float(m.group(1) + (m.group(2) or ""))
    return value * _SUFFIX[m.group(3)]


def retry_conflicts(fn: Callable[[], T], attempts: int = 10) -> T:
    """Run fn again (it re-reads) while the API answers 409 Conflict."""
    for i in range(attempts):
        try:
            return fn()
        except ApiException as e:
            if e.status != 409 or i == attempts - 1:
                raise
            time.sleep(0.05 * (i + 1))
    raise AssertionError("unreachable")


class _AddressLeases:
    """Pod addresses 127.0.0.N (N from 2 up, reused once free). Each is held through an
    flock'ed file, so that fake kubelets of concurrent test sessions on one machine never
    hand out the same address (their pods would fight over ports)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, int] = {}

    def acquire(self) -> str:
        n = 2
        while True:
            ip = f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
            if n & 255 not in (0, 255) and ip not in self._held:
                fd = os.open(self.dir / f"{ip}.lock", os.O_CREAT | os.O_RDWR, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                else:
                    self._held[ip] = fd
                    return ip
            n += 1

    def release(self, ip: str) -> None:
        fd = self._held.pop(ip, None)
        if fd is not None:
            os.close(fd)

    def release_all(self) -> None:
        for ip in list(self._held):
            self.release(ip)


@dataclass
class _PodState:
    uid: str
    namespace: str
    name: str
    ip: str
    log_path: Path
    start_time: str = field(default_factory=now_rfc3339)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    started_at: str = ""
    started_mono: float = 0.0
    starts: int = 0
    restart_count: int = 0
    next_start: float = 0.0
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    last_terminated: Obj | None = None
    finished: Obj | None = None  # the terminated state of a container that will not restart
    ready: bool = False
    probe_failures: int = 0
    next_probe: float = 0.0
    kill_deadline: float | None = None
    delete_sent: float = 0.0
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_patch: Obj | None = None
    last_patch_mono: float = 0.0
    #: The pod's volumes are set up (the real kubelet's PodReadyToStartContainers needs them).
    volumes_ready: bool = False
    #: Event (reason, message) pairs already posted for this pod: each is posted once.
    events: set[tuple[str, str]] = field(default_factory=set)


class FakeKubelet:
    """Context manager: `with FakeKubelet(control_plane) as kubelet: ...`.

    Methods for tests: `logs(pod, namespace=None)` (the pod's process output, every run),
    `dump(namespace=None)` (every pod's output, for failure reports), `pod_ip(pod, namespace)`,
    `pid(pod, namespace)` (the running process's pid, or None).
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        node_name: str = DEFAULT_NODE,
        log_dir: Path | None = None,
        image_entrypoints: Mapping[str, list[str]] | None = None,
        image_env: Mapping[str, Mapping[str, str]] | None = None,
        capacity: Mapping[str, str] = DEFAULT_CAPACITY,
        use_admin: bool = False,
    ) -> None:
        self.node_name = node_name
        self.log_dir = log_dir or control_plane.workdir / "kubelet" / node_name
        self.work_dir = self.log_dir.parent / f"{node_name}-pods"
        self.image_entrypoints = dict(image_entrypoints or {})
        #: Image repository -> the env its image sets (Dockerfile ENV, harness.images), under
        #: the container's own env as a container runtime applies it. Tests may add to it.
        self.image_env: dict[str, dict[str, str]] = {
            k: dict(v) for k, v in (image_env or {}).items()
        }
        self.capacity = dict(capacity)
        token = None if use_admin else control_plane.tokens.get(f"system:node:{node_name}")
        self._control_plane = control_plane
        self._token = token
        api = urlsplit(control_plane.server)
        self._service_env = {
            "KUBERNETES_SERVICE_HOST": api.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.port or 443),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(api.port or 443),
        }
        self._core = client.CoreV1Api(self._client())
        self._pods: dict[str, Obj] = {}  # uid -> pod, kept by the watch thread
        self._states: dict[str, _PodState] = {}  # uid -> runtime state, sync thread only
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_resp: Any = None
        self._node_uid = ""
        self._synced = threading.Event()
        self._deletes_sent: dict[str, float] = {}  # uid -> when, sync thread only
        self.status_writes = 0  # pod status patches sent (a test sees it settle)
        self._registered_at = now_rfc3339()
        self._reaper: procs.Reaper  # started by start()
        self._log_server: ThreadingHTTPServer | None = None
        self._log_port = 10250
        self._addresses = _AddressLeases(Path(tempfile.gettempdir()) / "fluidpd-fake-kubelet-ips")

    def _client(self) -> Any:
        """A fresh ApiClient as the node (one per thread)."""
        return self._control_plane.api_client(self._token)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> FakeKubelet:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        _check_loopback_alias()
        self._reaper = procs.Reaper()
        self._start_log_server()
        self._register_node()
        self._renew_lease()
        for name, target in (
            ("watch", self._watch_loop),
            ("sync", self._sync_loop),
            ("heartbeat", self._heartbeat_loop),
        ):
            thread = threading.Thread(target=target, name=f"fake-kubelet-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self._synced.wait(30.0):
            raise TimeoutError("fake kubelet: the first pod list did not come back in 30 s")
        log.info("fake kubelet %s up", self.node_name)
        return self

    def stop(self) -> None:
        """Stop every pod process (SIGTERM, then SIGKILL after 5 s) and mark the node NotReady."""
        self._stopping.set()
        self._wake.set()
        resp = self._watch_resp
        if resp is not None:
            # Unblock the watch thread's read. (resp.close() would wait for the reader.)
            with contextlib.suppress(Exception):
                resp.connection.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            # The watch thread is a daemon; at worst it notices at the watch's timeout.
            thread.join(timeout=2.0 if thread.name.endswith("watch") else 20.0)
        self._threads.clear()
        with contextlib.suppress(Exception):
            self._core.patch_node_status(
                self.node_name, {"status": {"conditions": self._node_conditions(ready=False)}}
            )
        if self._log_server is not None:
            self._log_server.shutdown()
            self._log_server.server_close()
            self._log_server = None

    # -- helpers for tests -------------------------------------------------------------------

    def log_files(self, pod: str, namespace: str | None = None) -> list[Path]:
        pattern = f"{namespace or '*'}_{pod}_*.log"
        return sorted(self.log_dir.glob(pattern), key=lambda p: p.stat().st_mtime)

    def logs(self, pod: str, namespace: str | None = None) -> str:
        """Everything the pod's processes wrote (every run, every pod of that name)."""
        return "".join(p.read_text(errors="replace") for p in self.log_files(pod, namespace))

    def dump(self, namespace: str | None = None, max_chars: int = 3000) -> str:
        """The end of every pod's output (in one namespace, or all), for failure reports."""
        parts = []
        for path in sorted(self.log_dir.glob(f"{namespace or '*'}_*.log")):
            parts.append(f"----- {path.name} -----\n{procs.tail(path, max_chars)}")
        return "\n".join(parts) or "(no pod output)"

    def _state(self, pod: str, namespace: str) -> _PodState | None:
        with self._lock:
            for state in self._states.values():
                if state.name == pod and state.namespace == namespace:
                    return state
        return None

    def pod_ip(self, pod: str, namespace: str) -> str | None:
        state = self._state(pod, namespace)
        return state.ip if state else None

    def pid(self, pod: str, namespace: str) -> int | None:
        state = self._state(pod, namespace)
        proc = state.proc if state else None
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- the kubelet API, for `kubectl logs` ----------------------------------------------------

    def _start_log_server(self) -> None:
        """Serve GET /containerLogs/<ns>/<pod>/<container> (tailLines, follow) over HTTPS on
        127.0.0.1, the node's kubeletEndpoint: the API server proxies `kubectl logs` here.
        Only the process output, without the kubelet's own notes."""
        pki = self._control_plane.workdir / "pki"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
        server = ThreadingHTTPServer(("127.0.0.1", 0), _log_handler(self))
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._log_port = int(server.server_address[1])
        self._log_server = server
        thread = threading.Thread(
            target=server.serve_forever, name="fake-kubelet-logs", daemon=True
        )
        thread.start()

    # -- node --------------------------------------------------------------------------------

    def _node_conditions(self, ready: bool = True) -> list[Obj]:
        now = now_rfc3339()
        since = self._registered_at if ready else now
        conditions = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            (
                "Ready",
                "True" if ready else "False",
                "KubeletReady" if ready else "KubeletStopped",
            ),
        ]
        return [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "fluidpd fake kubelet",
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }
            for kind, status, reason in conditions
        ]

    def _node_status(self) -> Obj:
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": self._node_conditions(),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._log_port}},
            "nodeInfo": {
                "machineID": "fluidpd-fake",
                "systemUUID": "fluidpd-fake",
                "bootID": "fluidpd-fake",
                "kernelVersion": os.uname().release,
                "osImage": "fluidpd fake kubelet",
                "containerRuntimeVersion": "fluidpd-fake://0.1",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register_node(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "fluidpd.io/fake-node": "true",
                },
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
        }
        try:
            node = self._core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
            node = self._core.read_node(self.node_name)
        self._node_uid = node.metadata.uid
        self._core.patch_node_status(self.node_name, {"status": self._node_status()})

        # TaintNodesByCondition put node.kubernetes.io/not-ready on the new Node; with the node
        # lifecycle controller off, the kubelet takes it away itself once Ready.
        def untaint() -> None:
            node = self._core.read_node(self.node_name)
            taints = node.spec.taints or []
            keep = [
                t
                for t in taints
                if t.key not in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ]
            if len(keep) != len(taints):
                self._core.replace_node(self.node_name, _with_taints(node, keep))

        retry_conflicts(untaint)

    def _renew_lease(self) -> None:
        coord = client.CoordinationV1Api(self._core.api_client)

        def renew() -> None:
            spec = {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": 40,
                "renewTime": now_micro(),
            }
            try:
                lease = coord.read_namespaced_lease(self.node_name, "kube-node-lease")
            except ApiException as e:
                if e.status != 404:
                    raise
                coord.create_namespaced_lease(
                    "kube-node-lease",
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {
                            "name": self.node_name,
                            "ownerReferences": [
                                {
                                    "apiVersion": "v1",
                                    "kind": "Node",
                                    "name": self.node_name,
                                    "uid": self._node_uid,
                                }
                            ],
                        },
                        "spec": spec,
                    },
                )
                return
            body = coord.api_client.sanitize_for_serialization(lease)
            body["spec"].update(spec)
            coord.replace_namespaced_lease(self.node_name, "kube-node-lease", body)

        retry_conflicts(renew)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(HEARTBEAT_PERIOD):
            try:
                self._renew_lease()
                self._core.patch_node_status(
                    self.node_name, {"status": {"conditions": self._node_conditions()}}
                )
            except Exception:
                if not self._stopping.is_set():
                    log.exception("fake kubelet: heartbeat failed")

    # -- watch -------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        core = client.CoreV1Api(self._client())
        selector = f"spec.nodeName={self.node_name}"
        rv: str | None = None
        while not self._stopping.is_set():
            try:
                if rv is None:
                    resp = core.list_pod_for_all_namespaces(
                        field_selector=selector, _preload_content=False, _request_timeout=30
                    )
                    data = json.loads(resp.data)
                    with self._lock:
                        self._pods = {p["metadata"]["uid"]: p for p in data["items"]}
                    rv = data["metadata"]["resourceVersion"]
                    self._synced.set()
                    self._wake.set()
                resp = core.list_pod_for_all_namespaces(
                    field_selector=selector,
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=30,
                    _preload_content=False,
                    _request_timeout=(5, 90),
                )
                self._watch_resp = resp
                try:
                    for line in iter_resp_lines(resp):
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            log.info("fake kubelet: watch ended: %s", obj.get("message"))
                            rv = None
                            break
                        rv = obj["metadata"]["resourceVersion"]
                        if event["type"] == "BOOKMARK":
                            continue
                        uid = obj["metadata"]["uid"]
                        with self._lock:
                            if event["type"] == "DELETED":
                                self._pods.pop(uid, None)
                            else:
                                self._pods[uid] = obj
                        self._wake.set()
                finally:
                    self._watch_resp = None
                    with contextlib.suppress(Exception):
                        resp.close()
                        resp.release_conn()
            except Exception as e:
                if self._stopping.is_set():
                    break
                log.warning("fake kubelet: pod watch failed (%s); listing again", e)
                rv = None
                self._stopping.wait(1.0)

    # -- sync --------------------------------------------------------------------------------

    def _sync_loop(self) -> None:
        core = client.CoreV1Api(self._client())
        try:
            while not self._stopping.is_set():
                self._wake.wait(SYNC_PERIOD)
                self._wake.clear()
                if self._stopping.is_set():
                    break
                with self._lock:
                    pods = dict(self._pods)
                for pod in pods.values():
                    try:
                        self._sync_pod(core, pod)
                    except Exception:
                        log.exception(
                            "fake kubelet: sync of %s/%s failed",
                            pod["metadata"]["namespace"],
                            pod["metadata"]["name"],
                        )
                try:
                    for uid in [u for u in self._states if u not in pods]:
                        self._forget(uid)
                    for uid in [u for u in self._deletes_sent if u not in pods]:
                        del self._deletes_sent[uid]
                except Exception:
                    # This thread must live: its children die with it (parent-death signal).
                    log.exception("fake kubelet: cleaning up after removed pods failed")
        finally:
            self._stop_all()

    def _forget(self, uid: str) -> None:
        """The pod is gone from the API: kill whatever still runs and free its address."""
        with self._lock:
            state = self._states.pop(uid)
        if state.proc is not None:
            procs.stop(state.proc, grace=0.5)
            self._reaper.discard(state.proc)
            _note(state, f"pod removed from the API; process {state.proc.pid} stopped")
        self._addresses.release(state.ip)

    def _stop_all(self) -> None:
        with self._lock:
            running = [s for s in self._states.values() if s.proc is not None]
        for state in running:
            if state.proc is not None:
                procs.signal_group(state.proc, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for state in running:
            if state.proc is not None:
                procs.stop(state.proc, grace=max(0.0, deadline - time.monotonic()))
                self._reaper.discard(state.proc)
        self._addresses.release_all()
        self._reaper.close()

    def _sync_pod(self, core: client.CoreV1Api, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        state = self._states.get(uid)
        if meta.get("deletionTimestamp"):
            self._terminate(core, pod, state)
            return
        if state is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return  # finished before this kubelet started
            ip = "127.0.0.1" if spec.get("hostNetwork") else self._addresses.acquire()
            state = _PodState(
                uid=uid,
                namespace=meta["namespace"],
                name=meta["name"],
                ip=ip,
                log_path=self.log_dir / f"{meta['namespace']}_{meta['name']}_{uid[:8]}.log",
            )
            with self._lock:
                self._states[uid] = state
        container = spec["containers"][0]
        now = time.monotonic()
        if state.proc is not None and state.proc.poll() is not None:
            self._on_exit(spec, state, now)
        if state.proc is None and state.finished is None and now >= state.next_start:
            self._start_container(core, pod, container, state, now)
        if state.proc is not None:
            self._probe(container, state, now)
        self._write_status(core, pod, state, now)

    def _on_exit(self, spec: Obj, state: _PodState, now: float) -> None:
        assert state.proc is not None
        code = state.proc.returncode
        procs.signal_group(state.proc, signal.SIGKILL)  # leave none of its children
        self._reaper.discard(state.proc)
        terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": state.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"fluidpd-fake://{state.proc.pid}",
        }
        if code < 0:
            terminated["signal"] = -code
        _note(state, f"process {state.proc.pid} exited with {code}")
        state.proc = None
        state.ready = False
        policy = spec.get("restartPolicy", "Always")
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            state.finished = terminated
            state.waiting = None
            return
        state.last_terminated = terminated
        # A run that lasted a while resets the back-off, as the kubelet's does after 10 min.
        ran = now - state.started_mono
        backoff = 0.0 if ran > 60 else min(MAX_BACKOFF, 0.5 * 2 ** max(0, state.starts - 1))
        state.next_start = now + backoff
        state.waiting = (
            "CrashLoopBackOff",
            f"back-off {backoff:.1f}s restarting failed container (exit {code})",
        )

    def _start_container(
        self, core: client.CoreV1Api, pod: Obj, container: Obj, state: _PodState, now: float
    ) -> None:
        pod_dir = self.work_dir / f"{state.namespace}_{state.name}_{state.uid[:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        # The kubelet's order: volumes before the sandbox (a failure leaves the pod in
        # ContainerCreating with a FailedMount Event), then the container's config.
        try:
            pod_volumes = volumes.set_up(core, pod, pod_dir)
        except volumes.VolumeError as e:
            state.volumes_ready = False
            state.waiting = ("ContainerCreating", "")
            state.next_start = now + 2.0
            self._event(core, pod, state, "FailedMount", str(e))
            return
        state.volumes_ready = True
        try:
            env = self._resolve_env(core, pod, container, state)
            kubeconfig = self._service_account_kubeconfig(core, pod, container, pod_dir)
            mounts = volumes.container_mounts(container, pod_volumes, env)
        except (ConfigError, volumes.SubPathError, ApiException) as e:
            message = e.reason if isinstance(e, ApiException) else str(e)
            state.waiting = ("CreateContainerConfigError", str(message))
            state.next_start = now + 1.0
            return
        argv = self._argv(container, env)
        if isinstance(argv, str):
            state.waiting = ("ErrImagePull", argv)
            state.next_start = now + 5.0
            return
        if mounts:
            argv = volumes.in_mount_namespace(argv, mounts)
        if state.starts > 0:
            state.restart_count += 1
        state.starts += 1
        cwd = pod_dir
        workdir = container.get("workingDir")
        if workdir and Path(workdir).is_dir():
            cwd = Path(workdir)
        proc_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        # `sh -c 'exec fluidpd ...'` finds this interpreter's fluidpd first.
        bin_dir = str(Path(sys.executable).parent)
        proc_env["PATH"] = os.pathsep.join([bin_dir, proc_env.get("PATH", "/usr/bin:/bin")])
        proc_env["HOSTNAME"] = state.name
        proc_env.update(self.image_env.get(_repository(container.get("image", "")), {}))
        if kubeconfig is not None:
            proc_env["KUBECONFIG"] = str(kubeconfig)
        proc_env.update(env)
        _note(state, f"start #{state.starts} on {state.ip}: {' '.join(argv)}")
        try:
            state.proc = procs.spawn(argv, state.log_path, env=proc_env, cwd=cwd)
            self._reaper.add(state.proc)
        except OSError as e:
            state.waiting = ("RunContainerError", f"fake kubelet: {e}")
            state.next_start = now + 5.0
            return
        state.env = proc_env
        state.started_at = now_rfc3339()
        state.started_mono = now
        state.waiting = None
        state.ready = False
        state.probe_failures = 0
        probe = container.get("readinessProbe") or {}
        state.next_probe = now + float(probe.get("initialDelaySeconds", 0))

    def _service_account_kubeconfig(
        self, core: client.CoreV1Api, pod: Obj, container: Obj, pod_dir: Path
    ) -> Path | None:
        """Where the real kubelet would mount the pod's service-account token, a kubeconfig.

        When the container mounts /var/run/secrets/kubernetes.io/serviceaccount (the
        ServiceAccount admission plugin adds it unless automounting is off), request a token
        bound to the pod and write it, ca.crt and namespace under pod_dir/serviceaccount plus
        a kubeconfig using them: the process gets KUBECONFIG pointing at it, so clients that
        fall back from in-cluster config to KUBECONFIG (kopf, kubernetes.config.load_config)
        act as the pod's ServiceAccount, under its RBAC.
        """
        mounts = {m.get("mountPath") for m in container.get("volumeMounts") or []}
        if SA_MOUNT not in mounts:
            return None
        meta, spec = pod["metadata"], pod["spec"]
        account = spec.get("serviceAccountName") or "default"
        request = core.create_namespaced_service_account_token(
            account,
            meta["namespace"],
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 86400,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            },
        )
        token = request.status.token
        sa_dir = pod_dir / "serviceaccount"
        sa_dir.mkdir(exist_ok=True)
        (sa_dir / "token").write_text(token)
        (sa_dir / "namespace").write_text(meta["namespace"])
        (sa_dir / "ca.crt").write_bytes(self._control_plane.ca_file.read_bytes())
        return self._control_plane.write_kubeconfig(
            pod_dir / "kubeconfig",
            token,
            f"system:serviceaccount:{meta['namespace']}:{account}",
            namespace=meta["namespace"],
        )

    def _argv(self, container: Obj, env: Mapping[str, str]) -> list[str] | str:
        """The argv to run, or why there is none."""
        image = container.get("image", "")
        command = list(container.get("command") or [])
        args = list(container.get("args") or [])
        if not command:
            entry = self.image_entrypoints.get(_repository(image))
            if entry is None:
                return (
                    f"fake kubelet: image {image!r} has no command and no known entrypoint; "
                    "it can't run as a local process"
                )
            command = list(entry)
        argv = [expand(a, env) for a in command + args]
        exe = argv[0]
        if exe == "fluidpd" or exe.endswith("/fluidpd"):
            local = Path(sys.executable).parent / "fluidpd"
            argv[:1] = (
                [str(local)] if local.exists() else [sys.executable, "-m", "fluidpd.cli.main"]
            )
        elif re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", exe):
            argv[0] = sys.executable
        elif "/" in exe:
            if not os.access(exe, os.X_OK):
                return f"fake kubelet: {exe} (image {image!r}) is not an executable here"
        else:
            found = shutil.which(exe)
            if found is None:
                return f"fake kubelet: {exe!r} (image {image!r}) is not on PATH here"
            argv[0] = found
        return argv

    # -- env ---------------------------------------------------------------------------------

    def _resolve_env(
        self, core: client.CoreV1Api, pod: Obj, container: Obj, state: _PodState
    ) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env: dict[str, str] = dict(self._service_env)
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                ref = source["configMapRef"]
                data = self._read_config_map(core, namespace, ref["name"], ref.get("optional"))
            elif "secretRef" in source:
                ref = source["secretRef"]
                data = self._read_secret(core, namespace, ref["name"], ref.get("optional"))
            else:
                continue
            for key, item in (data or {}).items():
                if ENV_NAME.match(prefix + key):
                    env[prefix + key] = item
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(var.get("value", ""), env)
                continue
            source = var["valueFrom"]
            value: str | None
            if "fieldRef" in source:
                value = self._field(pod, source["fieldRef"]["fieldPath"], state)
            elif "resourceFieldRef" in source:
                value = _resource_field(pod, container, source["resourceFieldRef"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                data = self._read_secret(core, namespace, ref["name"], ref.get("optional"))
                value = _key(data, ref, "secret")
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                data = self._read_config_map(core, namespace, ref["name"], ref.get("optional"))
                value = _key(data, ref, "configmap")
            else:
                raise ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
            if value is not None:
                env[name] = value
        return env

    def _read_secret(
        self, core: client.CoreV1Api, namespace: str, name: str, optional: bool | None
    ) -> dict[str, str] | None:
        try:
            secret = core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404 and optional:
                return None
            raise ConfigError(f'secret "{name}" not found ({e.status})') from e
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        data.update(secret.string_data or {})
        return data

    def _read_config_map(
        self, core: client.CoreV1Api, namespace: str, name: str, optional: bool | None
    ) -> dict[str, str] | None:
        try:
            config_map = core.read_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status == 404 and optional:
                return None
            raise ConfigError(f'configmap "{name}" not found ({e.status})') from e
        return dict(config_map.data or {})

    def _field(self, pod: Obj, path: str, state: _PodState) -> str:
        meta, spec = pod["metadata"], pod["spec"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "status.podIP": state.ip,
            "status.podIPs": state.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return str(simple[path])
        m = re.fullmatch(r"metadata\.(labels|annotations)(?:\['(.*)'\])?", path)
        if m:
            values = meta.get(m.group(1)) or {}
            if m.group(2) is None:
                return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
            return str(values.get(m.group(2), ""))
        raise ConfigError(f"unsupported fieldRef {path!r}")

    # -- readiness ---------------------------------------------------------------------------

    def _probe(self, container: Obj, state: _PodState, now: float) -> None:
        probe = container.get("readinessProbe")
        if not probe:
            state.ready = True
            return
        if now < state.next_probe:
            return
        state.next_probe = now + SYNC_PERIOD
        timeout = min(float(probe.get("timeoutSeconds", 1)), 2.0)
        try:
            ok = self._run_probe(probe, container, state, timeout)
        except Exception as e:
            log.debug("probe of %s failed: %s", state.name, e)
            ok = False
        if ok:
            state.ready = True
            state.probe_failures = 0
        else:
            state.probe_failures += 1
            if not state.ready or state.probe_failures >= int(probe.get("failureThreshold", 3)):
                state.ready = False

    def _run_probe(self, probe: Obj, container: Obj, state: _PodState, timeout: float) -> bool:
        if "httpGet" in probe:
            get = probe["httpGet"]
            host = get.get("host") or state.ip
            port = _port(container, get["port"])
            scheme = get.get("scheme", "HTTP").lower()
            path = get.get("path", "/")
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
            request = urllib.request.Request(f"{scheme}://{host}:{port}{path}", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as resp:
                    return 200 <= int(resp.status) < 400
            except urllib.error.HTTPError as e:
                return 200 <= e.code < 400
            except (urllib.error.URLError, OSError):
                return False
        if "tcpSocket" in probe or "grpc" in probe:
            target = probe.get("tcpSocket") or probe["grpc"]
            host = target.get("host") or state.ip
            try:
                with socket.create_connection((host, _port(container, target["port"])), timeout):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            argv = self._argv({"command": probe["exec"]["command"]}, state.env)
            if isinstance(argv, str):
                return False
            try:
                done = subprocess.run(
                    argv, env=state.env, capture_output=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                return False
            return done.returncode == 0
        return True

    # -- status ------------------------------------------------------------------------------

    def _condition(self, state: _PodState, kind: str, status: bool) -> Obj:
        value = "True" if status else "False"
        previous = state.transitions.get(kind)
        if previous is None or previous[0] != value:
            state.transitions[kind] = (value, now_rfc3339())
        return {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": state.transitions[kind][1],
        }

    def _container_status(self, pod: Obj, state: _PodState) -> Obj:
        container = pod["spec"]["containers"][0]
        status: Obj = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "restartCount": state.restart_count,
            "ready": state.ready and state.proc is not None,
            "started": state.proc is not None,
        }
        if state.proc is not None:
            status["containerID"] = f"fluidpd-fake://{state.proc.pid}"
            status["state"] = {"running": {"startedAt": state.started_at}}
        elif state.finished is not None:
            status["containerID"] = state.finished["containerID"]
            status["state"] = {"terminated": state.finished}
        else:
            reason, message = state.waiting or ("ContainerCreating", "")
            status["state"] = {"waiting": {"reason": reason, "message": message}}
        # As the API server stores it (an empty lastState included), so that a status the API
        # already shows is not written again.
        status["lastState"] = (
            {"terminated": state.last_terminated} if state.last_terminated is not None else {}
        )
        return status

    def _write_status(self, core: client.CoreV1Api, pod: Obj, state: _PodState, now: float) -> None:
        if state.finished is not None:
            phase = "Succeeded" if state.finished["exitCode"] == 0 else "Failed"
        elif state.starts > 0:
            phase = "Running"
        else:
            phase = "Pending"
        ready = state.ready and state.proc is not None
        statuses = [self._container_status(pod, state)]
        for extra in pod["spec"]["containers"][1:]:
            statuses.append(
                {
                    "name": extra["name"],
                    "image": extra.get("image", ""),
                    "imageID": "",
                    "restartCount": 0,
                    "ready": False,
                    "started": False,
                    "lastState": {},
                    "state": {
                        "waiting": {
                            "reason": "NotRunLocally",
                            "message": "the fake kubelet runs only the first container",
                        }
                    },
                }
            )
        managed: Obj = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": state.start_time,
            "conditions": [
                self._condition(
                    state,
                    "PodReadyToStartContainers",
                    state.volumes_ready and phase not in ("Succeeded", "Failed"),
                ),
                self._condition(state, "Initialized", True),
                self._condition(state, "Ready", ready),
                self._condition(state, "ContainersReady", ready),
                self._condition(state, "PodScheduled", True),
            ],
            "containerStatuses": statuses,
        }
        if phase != "Pending" or state.proc is not None:
            managed["podIP"] = state.ip
            managed["podIPs"] = [{"ip": state.ip}]
        current = pod.get("status") or {}
        # Write when something changed, or when the API shows something else for a while (a
        # write lost, or another writer) -- not while the watch is merely catching up.
        stale = any(current.get(k) != v for k, v in managed.items())
        if managed == state.last_patch and (not stale or now - state.last_patch_mono < 2.0):
            return
        body = {**current, **managed}
        try:
            core.patch_namespaced_pod_status(
                state.name,
                state.namespace,
                [
                    {"op": "test", "path": "/metadata/uid", "value": state.uid},
                    {"op": "replace", "path": "/status", "value": body},
                ],
            )
        except ApiException as e:
            if e.status in (404, 409, 422):
                log.debug("status of %s/%s not written: %s", state.namespace, state.name, e)
                return
            raise
        state.last_patch = managed
        state.last_patch_mono = now
        self.status_writes += 1

    # -- events ------------------------------------------------------------------------------

    def _event(
        self, core: client.CoreV1Api, pod: Obj, state: _PodState, reason: str, message: str
    ) -> None:
        """A Warning Event on the pod from this node's kubelet, once per reason and message
        (the real kubelet's recorder folds repeats into a count)."""
        if (reason, message) in state.events:
            return
        state.events.add((reason, message))
        _note(state, f"{reason}: {message}")
        meta = pod["metadata"]
        now = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            core.create_namespaced_event(meta["namespace"], body)
        except ApiException as e:  # best effort, as the kubelet's
            log.debug(
                "event %s on %s/%s not posted: %s", reason, meta["namespace"], meta["name"], e
            )

    # -- deletion ----------------------------------------------------------------------------

    def _terminate(self, core: client.CoreV1Api, pod: Obj, state: _PodState | None) -> None:
        """SIGTERM, SIGKILL after the grace period, then delete the pod for good."""
        meta, spec = pod["metadata"], pod["spec"]
        now = time.monotonic()
        if state is not None and state.proc is not None:
            proc = state.proc
            if proc.poll() is None:
                if state.kill_deadline is None:
                    grace = meta.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = spec.get("terminationGracePeriodSeconds", 30)
                    state.kill_deadline = now + min(float(grace), MAX_GRACE)
                    _note(state, f"pod deleted: SIGTERM to {proc.pid}")
                    procs.signal_group(proc, signal.SIGTERM)
                    return
                if now < state.kill_deadline:
                    return
                _note(state, f"grace period over: SIGKILL to {proc.pid}")
            code = procs.stop(proc, grace=0.0)
            self._reaper.discard(proc)
            _note(state, f"process {proc.pid} ended with {code}")
            state.proc = None
        if now - self._deletes_sent.get(meta["uid"], -10.0) < 2.0:
            return
        self._deletes_sent[meta["uid"]] = now
        try:
            core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=meta["uid"]),
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise


def _note(state: _PodState, message: str) -> None:
    """A line in the pod's log, so test output shows what the kubelet did."""
    with contextlib.suppress(OSError), state.log_path.open("a") as f:
        one_line = message.replace("\n", "\\n")
        f.write(f"[fake-kubelet {now_rfc3339()}] {one_line}\n")


def _key(data: Mapping[str, str] | None, ref: Obj, kind: str) -> str | None:
    if data is None:
        return None
    if ref["key"] in data:
        return data[ref["key"]]
    if ref.get("optional"):
        return None
    raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ref['name']}")


def _repository(image: str) -> str:
    """An image reference without digest and tag (``ghcr.io/x/y:1@sha256:...``: ``ghcr.io/x/y``)."""
    repo = image.rsplit("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return repo


def _resource_field(pod: Obj, container: Obj, ref: Obj) -> str:
    """limits.cpu / requests.memory ... (defaulting limits to node capacity) over the divisor."""
    if ref.get("containerName"):
        matches = [c for c in pod["spec"]["containers"] if c["name"] == ref["containerName"]]
        if not matches:
            raise ConfigError(f"no container {ref['containerName']!r}")
        container = matches[0]
    kind, _, resource = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(resource)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(resource)
    if raw is None:
        raw = DEFAULT_CAPACITY.get(resource, "0")
    divisor = parse_quantity(ref.get("divisor", "1"))
    return str(math.ceil(parse_quantity(raw) / divisor))


def _port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ConfigError(f"no container port named {port!r}")


def _with_taints(node: Any, taints: list[Any]) -> Any:
    node.spec.taints = taints or None
    return node


def _log_handler(kubelet: FakeKubelet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if parts == ["healthz"]:
                self._reply(200, b"ok")
                return
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._reply(404, b"the fake kubelet serves only containerLogs")
                return
            _, namespace, pod, _container = parts
            files = kubelet.log_files(pod, namespace)
            if not files:
                self._reply(404, f"no output of pod {namespace}/{pod}".encode())
                return
            query = parse_qs(url.query)
            follow = query.get("follow", ["false"])[0] == "true"
            with files[-1].open("rb") as f:
                data = f.read()
            lines = [line for line in data.splitlines(keepends=True) if not _is_note(line)]
            if "tailLines" in query:
                lines = lines[-int(query["tailLines"][0]) :] if int(query["tailLines"][0]) else []
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                self.wfile.write(b"".join(lines))
                self.wfile.flush()
                offset, partial = len(data), b""
                while follow and not kubelet._stopping.is_set():
                    if kubelet._state(pod, namespace) is None:
                        break
                    time.sleep(0.5)
                    with files[-1].open("rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    chunk, partial = partial + chunk, b""
                    *whole, partial = chunk.split(b"\n")
                    out = [line + b"\n" for line in whole if not _is_note(line)]
                    if out:
                        self.wfile.write(b"".join(out))
                        self.wfile.flush()
            except OSError:
                pass  # the client went away

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _is_note(line: bytes) -> bool:
    return line.startswith(b"[fake-kubelet ")


def _check_loopback_alias() -> None:
    """Pods listen on 127.0.0.N; Linux routes all of 127/8 to lo, other systems may not."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.2", 0))
    except OSError as e:
        raise RuntimeError(
            f"fake kubelet: can't bind 127.0.0.2 ({e}); pods need loopback addresses beyond "
            "127.0.0.1 (Linux has them all; elsewhere add aliases to lo)"
        ) from e
