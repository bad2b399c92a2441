"""``fluidpd up`` binds every port itself before it starts anything, and hands each to its
process: a taken port is one line and nothing starts (before, the sidecar that lost its port
exited while whatever held the port answered ``up``'s health check, and ``up`` reported the
stack up); ``--port 0`` runs on free ports, which the run directory names; and a part that
dies once the stack is up is said on ``up``'s output while the rest keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fluidpd.drills.stack import LocalStack, free_port_block
from fluidpd.procs import alive


class _AlwaysOk(BaseHTTPRequestHandler):
    """Another program's server: 200 to anything, /healthz included."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: object) -> None:
        """Quiet: a test's output is its assertions."""


@pytest.fixture
def foreign() -> Iterator[int]:
    """The port of a foreign HTTP server on 127.0.0.1, whose port below was free when it
    started: the ``--base-port`` case puts the first sidecar there. (Below a port the kernel
    picked, another process's connection held it once: "Address already in use" for the
    wrong port.)"""
    for _ in range(20):
        base = free_port_block(2)
        try:
            server = ThreadingHTTPServer(("127.0.0.1", base + 1), _AlwaysOk)
        except OSError:  # taken since free_port_block looked
            continue
        break
    else:
        pytest.fail("no two consecutive free ports on 127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _up(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fluidpd.cli.main", "up", "--pd", "1P1D", "--policy", "static"]
    return subprocess.run(
        [*argv, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("taken", ["--port", "--base-port"])
def test_a_taken_port_is_one_line_and_nothing_starts(
    tmp_path: Path, foreign: int, taken: str
) -> None:
    if taken == "--port":
        ports = ["--port", str(foreign), "--base-port", str(free_port_block(1))]
    else:  # the second sidecar's port is the foreign one
        ports = ["--port", str(free_port_block(1)), "--base-port", str(foreign - 1)]
    done = _up(tmp_path / "run", *ports)
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert taken in lines[0] and f"127.0.0.1:{foreign}" in lines[0], lines[0]
    assert "in use" in lines[0].lower(), lines[0]
    assert "FluidPD is up" not in done.stdout
    assert not list((tmp_path / "run").glob("*.pid"))  # nothing was started


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def test_free_ports_are_named_and_a_dead_part_is_reported(
    stack_factory: Callable[..., LocalStack],
) -> None:
    stack = stack_factory("1P2D", "static")  # LocalStack runs `up --port 0`
    ports = {int(u.rsplit(":", 1)[1]) for u in (stack.endpoint, *stack.workers.values())}
    assert len(ports) == 4 and 0 not in ports
    assert (stack.run_dir / "endpoint").read_text().strip() == stack.endpoint
    for url in stack.workers.values():
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as resp:
            assert resp.status == 200
    # `up` kept no copy of the sidecar's socket: once it dies, its port refuses at once
    # (the router then drops it) instead of queueing connections nobody accepts.
    victim = stack.pids()["w2"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    out = stack.run_dir / "up.out"
    while "w2 exited" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"w2 exited with status {-signal.SIGKILL}" in out.read_text()
    assert not alive(victim)
    assert _refused(f"{stack.workers['w2']}/healthz")
    with urllib.request.urlopen(f"{stack.workers['w1']}/readyz", timeout=10) as resp:
        assert resp.status == 200
