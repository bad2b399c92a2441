"""fluidpd.procs: children that die with their launcher, and waiting for HTTP to answer."""

from __future__ import annotations

import http.server
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluidpd.procs import alive, http_ok, spawn, stop, wait_http

LAUNCHER = """
import signal, subprocess, sys
from fluidpd.procs import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         preexec_fn=die_with_parent(signal.SIGKILL))
print(child.pid, flush=True)
sys.stdin.read()  # until the test closes stdin; then this launcher exits without a word
"""


def test_a_child_dies_with_its_launcher() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert launcher.stdout is not None and launcher.stdin is not None
    child = int(launcher.stdout.readline())
    assert alive(child)
    launcher.stdin.close()
    launcher.wait(30)
    deadline = time.monotonic() + 30
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_ok_is_true_only_for_a_200(server: str) -> None:
    assert http_ok(f"{server}/healthz")
    assert not http_ok(f"{server}/other")  # 503
    assert not http_ok(f"http://127.0.0.1:{_closed_port()}/healthz")  # refused


def test_wait_http_answers_whether_it_came_up(server: str) -> None:
    assert wait_http(f"{server}/healthz", 5.0)
    assert not wait_http(f"{server}/other", 0.0)
    assert not wait_http(f"http://127.0.0.1:{_closed_port()}/healthz", 0.5)


STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(1, flush=True)
time.sleep(120)
"""


def test_stop_ends_willing_and_stubborn_children_within_its_deadline() -> None:
    willing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None
    stubborn.stdout.readline()  # its SIGTERM handler is in place
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(30)
    t0 = time.monotonic()
    stop([stubborn, willing, done], timeout=1.0)
    took = time.monotonic() - t0
    assert willing.returncode == -signal.SIGTERM  # asked, and it went
    assert stubborn.returncode == -signal.SIGKILL  # ignored the ask: killed at the deadline
    assert done.returncode == 0  # already gone: not signalled
    assert 1.0 <= took < 10.0  # one deadline for all, not one each


def test_spawn_logs_the_childs_output_appending_or_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    say = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    assert spawn(say, log).wait(30) == 0
    assert spawn(say, log).wait(30) == 0  # a restart's output goes on after the first's
    assert log.read_text().split() == ["out", "err", "out", "err"]
    assert spawn(say, log, append=False).wait(30) == 0  # a fresh run starts the log again
    assert log.read_text().split() == ["out", "err"]
