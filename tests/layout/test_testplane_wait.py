"""e2e/harness/binaries.py: a test that needs some of the test binaries waits only for those,
while another process's build (holding build-binaries.sh's flock) makes the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import binaries


def test_waits_for_its_binaries_not_for_the_whole_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUIDPD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FLUIDPD_TESTPLANE_BIN", raising=False)
    monkeypatch.setattr(binaries, "POLL_S", 0.2)
    ok, bin_dir = binaries._check(("helm",))
    assert not ok and bin_dir.is_dir() and bin_dir.is_relative_to(tmp_path)
    # Another "build" holds the lock (the real flock(1) build-binaries.sh takes) for 60 s.
    lock = subprocess.Popen(
        ["flock", str(bin_dir.parent / ".build.lock"), "sleep", "60"], start_new_session=True
    )
    try:
        while not binaries._building(bin_dir):
            time.sleep(0.05)

        def publish() -> None:
            time.sleep(1.0)
            helm = bin_dir / "helm"
            helm.write_text("#!/bin/sh\n")
            helm.chmod(0o755)

        threading.Thread(target=publish).start()
        t0 = time.monotonic()
        assert binaries.ensure_binaries(("helm",)) == bin_dir
        # Returned once helm appeared, with the build (the lock) still running.
        assert lock.poll() is None and time.monotonic() - t0 < 30
        assert not binaries.binaries_ready()  # the rest is not built
    finally:
        os.killpg(lock.pid, signal.SIGKILL)
        lock.wait()
    # flock's child (sleep) holds the lock too and dies on its own schedule after the SIGKILL
    # (once, a full run checked before it had): the lock is free within a few seconds.
    deadline = time.monotonic() + 10
    while binaries._building(bin_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not binaries._building(bin_dir)
