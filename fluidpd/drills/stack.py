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


def urls_of(run_dir: Path) -> tuple[str, dict[str, str]]:
    """The router's URL and the workers' by id, as a ``fluidpd up`` that is up wrote them
    into its run directory (``endpoint`` appears last)."""
    lines = (run_dir / "workers").read_text().split()
    return (run_dir / "endpoint").read_text().strip(), dict(x.split("=", 1) for x in lines)


#: Seconds a component of a local stack may take to answer its health check: on the shared
#: 2-core machine at load 13-17, `fluidpd up`'s default 60 s left workers behind (issue #14's
#: live Azure slice did not start twice).
READY_TIMEOUT_S = 300


class LocalStack:
    """``with LocalStack(run_dir, "3P3D", "fluidpd") as stack:`` - endpoint, worker URLs, pids.

    ``fluidpd up`` picks free ports itself (``--port 0``) and holds each from the moment it
    binds it: a block chosen here and bound by the children later could be taken in between by
    another stack starting beside this one."""

    def __init__(
        self,
        run_dir: Path,
        pd: str = "2P2D",
        policy: str = "static",
        *extra: str,
        token: str = "local-drill",
    ) -> None:
        self.run_dir = run_dir
        self.token = token
        self.endpoint = ""  # known once entered
        self.workers: dict[str, str] = {}
        exe = shutil.which("fluidpd")
        cmd = [exe] if exe else [sys.executable, "-m", "fluidpd.cli.main"]
        self.argv = [
            *cmd, "up", "--pd", pd, "--policy", policy, "--port", "0",
            "--run-dir", str(run_dir), "--ready-timeout", str(READY_TIMEOUT_S), *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def pids(self) -> dict[str, int]:
        return {f.stem: int(f.read_text()) for f in self.run_dir.glob("*.pid")}

    def __enter__(self) -> LocalStack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "endpoint").unlink(missing_ok=True)
        out = (self.run_dir / "up.out").open("wb")
        env = {**os.environ, "FLUIDPD_ADMIN_TOKEN": self.token}
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_up(self.proc)
            # `up` waited for its workers' health; "ready" (active in a role) is one step on.
            for url in self.workers.values():
                wait_http(f"{url}/readyz", READY_TIMEOUT_S)
            time.sleep(1.0)  # the router's first poll of every worker
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            raise RuntimeError(
                f"the stack did not start ({exc}); see {self.run_dir}/up.out"
            ) from None
        return self

    def _wait_up(self, proc: subprocess.Popen[bytes]) -> None:
        """Until ``up`` writes its endpoint (it is up) or exits (it says why in up.out)."""
        endpoint = self.run_dir / "endpoint"
        # `up` gives up on its own after READY_TIMEOUT_S; the margin covers its own start.
        deadline = time.monotonic() + READY_TIMEOUT_S + 60
        while not endpoint.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"fluidpd up exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"fluidpd up was not up within {READY_TIMEOUT_S + 60} s")
            time.sleep(0.1)
        self.endpoint, self.workers = urls_of(self.run_dir)

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
