"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler as local processes, set up the way controller-runtime's envtest does.

    with ControlPlane() as cp:
        cp.kubectl("get", "namespaces")
        core = kubernetes.client.CoreV1Api(cp.api_client())

The components get SIGKILL when the thread that started them ends (a parent-death signal, so
that nothing outlives a killed test run): start the plane from a thread that lives as long as
it, e.g. the main thread.

Authentication is by static bearer tokens (one per user, see `tokens`); the admin is in group
system:masters. Authorization is Node,RBAC. Everything (certificates, etcd data, logs,
kubeconfigs) lives in one temporary directory that is removed on exit unless `keep_dir`.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import secrets
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fluidpd.procs import http_ok
from harness import procs
from harness.binaries import CONTROL_PLANE, ensure_binaries
from harness.wait import wait_for

log = logging.getLogger("fluidpd.e2e.controlplane")

DEFAULT_NODE = "fluidpd-fake-node"
SERVICE_CIDR = "10.0.0.0/24"
UNPRIVILEGED_USER = "fluidpd-e2e-nobody"


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; its message carries kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.output}\nstderr: {self.stderr}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(
            x509.SubjectAlternativeName(sans), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager, kube-scheduler) on 127.0.0.1.

    Attributes once started: `server` (https URL), `token` (admin bearer token), `kubeconfig`
    (admin kubeconfig path), `ca_file`, `bin_dir`, `workdir`, `tokens` (user -> token for the
    admin, the unprivileged user `UNPRIVILEGED_USER`, the controller manager, the scheduler and
    `system:node:<name>` for each of `node_names`).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        keep_dir: bool = False,
        controller_manager: bool = True,
        scheduler: bool = True,
        node_names: Sequence[str] = (DEFAULT_NODE,),
        startup_timeout: float = 120.0,
    ) -> None:
        self._bin_dir = bin_dir
        self._workdir_arg = workdir
        self.keep_dir = keep_dir or workdir is not None
        self.with_controller_manager = controller_manager
        self.with_scheduler = scheduler
        self.node_names = tuple(node_names)
        self.startup_timeout = startup_timeout
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}
        self.server = ""
        self.token = ""
        self.startup_seconds = 0.0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir = Path()
        self.kubeconfig = Path()
        self.ca_file = Path()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(CONTROL_PLANE)
        return self._bin_dir

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        bin_dir = self.bin_dir
        if self._workdir_arg is not None:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="fluidpd-testplane-")
            self.workdir = Path(self._tmp.name)
        try:
            self._write_pki()
            etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
            self.server = f"https://127.0.0.1:{api_port}"
            self._write_kubeconfigs()
            self._start(
                "etcd",
                [
                    str(bin_dir / "etcd"),
                    "--name=default",
                    f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
            )
            self._wait_http("etcd", f"http://127.0.0.1:{etcd_port}/health", t0)
            pki = self.workdir / "pki"
            self._start(
                "kube-apiserver",
                [
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    f"--cert-dir={pki}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--token-auth-file={pki / 'tokens.csv'}",
                    "--authorization-mode=Node,RBAC",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    # Endpoints may not point at loopback, so nothing reconciles `kubernetes`.
                    "--endpoint-reconciler-type=none",
                    "--allow-privileged=true",
                    # `kubectl logs` reaches the fake kubelet at the node's InternalIP.
                    "--kubelet-preferred-address-types=InternalIP",
                    "--profiling=false",
                    "--v=1",
                ],
            )
            self._wait_http("kube-apiserver", f"{self.server}/readyz", t0, auth=True)
            if self.with_controller_manager:
                self._start(
                    "kube-controller-manager",
                    [
                        str(bin_dir / "kube-controller-manager"),
                        f"--kubeconfig={self.workdir / 'kube-controller-manager.kubeconfig'}",
                        "--leader-elect=false",
                        "--secure-port=0",
                        # No node lifecycle: it would taint and evict when the fake kubelet is
                        # not running; garbage collection, workloads, namespaces all run.
                        "--controllers=*,-nodelifecycle",
                        "--use-service-account-credentials=true",
                        f"--service-account-private-key-file={pki / 'sa.key'}",
                        f"--root-ca-file={pki / 'ca.crt'}",
                        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                        f"--cluster-signing-key-file={pki / 'ca.key'}",
                        f"--service-cluster-ip-range={SERVICE_CIDR}",
                        "--cluster-name=fluidpd-e2e",
                        "--v=1",
                    ],
                )
            if self.with_scheduler:
                self._start(
                    "kube-scheduler",
                    [
                        str(bin_dir / "kube-scheduler"),
                        f"--kubeconfig={self.workdir / 'kube-scheduler.kubeconfig'}",
                        "--leader-elect=false",
                        "--secure-port=0",
                        "--v=1",
                    ],
                )
            if self.with_controller_manager:
                # The service-account controller creating `default` shows KCM is working.
                self._wait(
                    "kube-controller-manager",
                    lambda: (
                        self.kubectl("get", "serviceaccount", "default", check=False).returncode
                        == 0
                    ),
                    t0,
                )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        log.info("control plane up at %s in %.1f s", self.server, self.startup_seconds)
        return self

    def stop(self) -> None:
        """Stop every component (scheduler and controllers first, etcd last); remove the dir."""
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                procs.stop(proc, grace=10.0)
        if self._tmp is not None and not self.keep_dir:
            self._tmp.cleanup()
            self._tmp = None

    # -- clients -----------------------------------------------------------------------------

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Until the CRD serves. Polled rather than ``kubectl wait --for=condition=Established``:
        that exits at once with an accessor error while the CRD has no status yet (right after
        its apply, which a loaded machine makes long enough to hit)."""
        path = '{.status.conditions[?(@.type=="Established")].status}'

        def established() -> bool:
            out = self.kubectl("get", f"crd/{crd}", "-o", f"jsonpath={path}", check=False)
            return out.returncode == 0 and out.stdout.strip() == "True"

        wait_for(established, timeout=timeout, what=f"CRD {crd} Established")

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this plane (admin unless kubeconfig is given); text output."""
        cmd = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            *args,
        ]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def helm(
        self, *args: str, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this plane as the admin (helm may still be building when the plane
        starts; this waits for it)."""
        helm = ensure_binaries(("helm",)) / "helm"
        cmd = [str(helm), f"--kubeconfig={self.kubeconfig}", *args]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.workdir),
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def api_client(self, token: str | None = None) -> Any:
        """A `kubernetes.client.ApiClient` for this plane (admin unless a token is given)."""
        from kubernetes import client  # noqa: PLC0415 (the client is optional for imports)

        config = client.Configuration()
        config.host = self.server
        config.ssl_ca_cert = str(self.ca_file)
        config.verify_ssl = True
        config.api_key = {"authorization": token or self.token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def write_kubeconfig(
        self, path: Path, token: str, user: str = "user", namespace: str | None = None
    ) -> Path:
        """A kubeconfig for this plane authenticating with token (e.g. a tokens[...] entry),
        its context in namespace when given."""
        ca_data = self.ca_file.read_bytes()
        context: dict[str, str] = {"cluster": "fluidpd-e2e", "user": user}
        if namespace:
            context["namespace"] = namespace

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fluidpd-e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(ca_data).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": context}],
            "current-context": user,
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    def logs(self, max_chars: int = 4000) -> str:
        """The end of every component's log, for failure reports."""
        parts = []
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            path = self.workdir / "logs" / f"{name}.log"
            if path.exists():
                parts.append(f"----- {name} ({path}) -----\n{procs.tail(path, max_chars)}")
        return "\n".join(parts)

    def check_alive(self) -> None:
        """Raise if a component has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}:\n"
                    + procs.tail(self.workdir / "logs" / f"{name}.log")
                )

    # -- internals ---------------------------------------------------------------------------

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("fluidpd-e2e-ca", ca_key, None, ca_key, ca=True)
        api_key = ec.generate_private_key(ec.SECP256R1())
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        api_cert = _cert(
            "kube-apiserver",
            api_key,
            ca,
            ca_key,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", service_ip),
        )
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        files = {
            "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
            "ca.key": _pem_key(ca_key),
            "apiserver.crt": api_cert.public_bytes(serialization.Encoding.PEM),
            "apiserver.key": _pem_key(api_key),
            "sa.key": _pem_key(sa_key),
            "sa.pub": sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        }
        for name, data in files.items():
            (pki / name).write_bytes(data)
            (pki / name).chmod(0o600)
        self.ca_file = pki / "ca.crt"
        users: dict[str, tuple[str, ...]] = {
            "admin": ("system:masters",),
            UNPRIVILEGED_USER: (),
            "system:kube-controller-manager": (),
            "system:kube-scheduler": (),
        }
        for node in self.node_names:
            users[f"system:node:{node}"] = ("system:nodes",)
        lines = []
        for user, groups in users.items():
            token = secrets.token_hex(16)
            self.tokens[user] = token
            lines.append(f'{token},{user},{user},"{",".join(groups)}"')
        (pki / "tokens.csv").write_text("\n".join(lines) + "\n")
        (pki / "tokens.csv").chmod(0o600)
        self.token = self.tokens["admin"]

    def _write_kubeconfigs(self) -> None:
        self.kubeconfig = self.write_kubeconfig(
            self.workdir / "admin.kubeconfig", self.token, "admin"
        )
        for user in ("system:kube-controller-manager", "system:kube-scheduler"):
            self.write_kubeconfig(
                self.workdir / f"{user.split(':')[-1]}.kubeconfig", self.tokens[user], user
            )

    def _start(self, name: str, argv: list[str]) -> None:
        log_path = self.workdir / "logs" / f"{name}.log"
        (self.workdir / "logs").mkdir(exist_ok=True)
        (self.workdir / "logs" / f"{name}.cmd").write_text(" ".join(argv) + "\n")
        self.procs[name] = procs.spawn(argv, log_path, cwd=self.workdir)

    def _wait(self, name: str, ready: Any, t0: float) -> None:
        deadline = t0 + self.startup_timeout
        while True:
            self.check_alive()
            if ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{name} not ready after {self.startup_timeout:.0f} s:\n" + self.logs()
                )
            time.sleep(0.2)

    def _wait_http(self, name: str, url: str, t0: float, *, auth: bool = False) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file)) if auth else None
        headers: Mapping[str, str] = {"Authorization": f"Bearer {self.token}"} if auth else {}

        self._wait(name, lambda: http_ok(url, 2.0, headers, context), t0)
