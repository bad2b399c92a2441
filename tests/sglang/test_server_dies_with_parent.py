"""The SGLang server a sidecar starts dies with the sidecar, however the sidecar dies: a
SIGKILLed sidecar (an OOM kill, ``kill -9``) must not leave SGLang holding the GPU and its
ports. The "SGLang" here is a real process that records its pid and sleeps, started by the
real ``SglangServer`` in a real sidecar-like parent process that is then SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fluidpd.procs import alive

PARENT = """
import asyncio, sys
from pathlib import Path
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer
cfg = SglangConfig(python=sys.argv[1], model_dir=Path("/nonexistent"), port=1, hook_port=2,
                   device="cpu", log_path=Path(sys.argv[2]), start_timeout_s=600)
asyncio.run(SglangServer(cfg).start())
"""


def test_sigkilled_parent_takes_the_server_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "server.pid"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    fake_python.chmod(0o755)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(fake_python), str(tmp_path / "log")]
    )
    try:
        t0 = time.monotonic()
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert parent.poll() is None and time.monotonic() - t0 < 120, "no server started"
            time.sleep(0.1)
        server = int(pidfile.read_text())
        assert alive(server)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        t0 = time.monotonic()
        while alive(server) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        if alive(server):
            os.kill(server, signal.SIGKILL)
            raise AssertionError("the server outlived its SIGKILLed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
