"""The shm transport's arenas: a SIGKILLed sidecar's arena is swept by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fluidpd_sidecar.transfer_shm import ShmTransfer


def test_arenas_of_dead_processes_are_swept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"fluidpd-kv-{gone.stdout.strip()}-0badf00d"
    live = tmp_path / f"fluidpd-kv-{os.getppid()}-0123abcd"
    other = tmp_path / "someone-else"
    for path in (dead, live, other):
        path.write_bytes(b"x")
    transfer = ShmTransfer(1 << 20, directory=tmp_path)
    try:
        assert not dead.exists()
        assert live.exists() and other.exists() and transfer.path.exists()
    finally:
        transfer.close()
    assert not transfer.path.exists()
