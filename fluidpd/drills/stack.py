"""Start and stop a whole local deployment (``fluidpd up``) from Python, on free ports.

Shipped, not test-only: ``fluidpd evaluate`` (``make run``) and the ``fluidpd drill`` commands
run their live stacks through it; the tests and ``scripts/gpu`` use the same one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from fluidpd import procs
from fluidpd.procs import alive


def free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive free ports (best effort: ports can be taken later)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n >= 65000:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no block of free ports")


def wait_http(url: str, timeout: float) -> None:
    if not procs.wait_http(url, timeout):
        raise TimeoutError(f"{url} did not answer within {timeout:g} s")


#: Seconds a component of a local stack may take to answer its health check: on the shared
#: 2-core machine at load 13-17, `fluidpd up`'s default 60 s left workers behind (issue #14's
#: live Azure slice did not start twice).
READY_TIMEOUT_S = 300


class LocalStack:
    """``with LocalStack(run_dir, "3P3D", "fluidpd") as stack:`` - endpoint, worker URLs, pids."""

    def __init__(
        self,
        run_dir: Path,
        pd: str = "2P2D",
        policy: str = "static",
        *extra: str,
        token: str = "local-drill",
    ) -> None:
        p, d = pd.upper().rstrip("D").split("P")
        self.n = int(p) + int(d)
        self.run_dir = run_dir
        self.token = token
        base = free_port_block(self.n + 1)
        self.endpoint = f"http://127.0.0.1:{base}"
        self.workers = {f"w{i}": f"http://127.0.0.1:{base + 1 + i}" for i in range(self.n)}
        exe = shutil.which("fluidpd")
        cmd = [exe] if exe else [sys.executable, "-m", "fluidpd.cli.main"]
        self.argv = [
            *cmd, "up", "--pd", pd, "--policy", policy, "--port", str(base),
            "--base-port", str(base + 1), "--run-dir", str(run_dir),
            "--ready-timeout", str(READY_TIMEOUT_S), *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def pids(self) -> dict[str, int]:
        return {f.stem: int(f.read_text()) for f in self.run_dir.glob("*.pid")}

    def __enter__(self) -> LocalStack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        out = (self.run_dir / "up.out").open("wb")
        env = {**os.environ, "FLUIDPD_ADMIN_TOKEN": self.token}
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            # Generous: on a loaded machine six Python processes take a while to import.
            wait_http(f"{self.endpoint}/healthz", READY_TIMEOUT_S)
            for url in self.workers.values():
                wait_http(f"{url}/readyz", READY_TIMEOUT_S)
            time.sleep(1.0)  # the router's first poll of every worker
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"the stack did not start; see {self.run_dir}/up.out") from None
        return self

    def stop(self) -> list[str]:
        """Stops the stack; returns the components that outlived it (should be none)."""
        if self.proc is not None:
            procs.stop([self.proc], 30)
        return [name for name, pid in self.pids().items() if alive(pid)]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
