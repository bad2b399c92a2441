"""Child processes that die with their parent and are stopped as a whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import fluidpd.procs


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv in its own session (its own process group), stdout+stderr appended to log_path.

    The parent-death signal is tied to the calling thread: spawn from a long-lived thread.
    """
    return fluidpd.procs.spawn(
        argv,
        log_path,
        env=env,
        cwd=cwd,
        death_signal=signal.SIGKILL,
        new_session=True,
        stdin=subprocess.DEVNULL,
    )


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send sig to the process group proc leads (its children included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM the group, SIGKILL it after grace seconds; reap; return the exit status."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    # Whatever the leader did, leave nothing of its group behind.
    signal_group(proc, signal.SIGKILL)
    return proc.wait()


def tail(path: Path, max_chars: int = 6000) -> str:
    """The end of a log file, or a note that there is none."""
    try:
        data = path.read_bytes()
    except OSError:
        return f"(no log at {path})"
    text = data[-max_chars:].decode("utf-8", errors="replace")
    return text if len(data) <= max_chars else "...\n" + text


_REAPER = r"""
import os, signal, sys
groups = set()
def reap(*_):
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
signal.signal(signal.SIGINT, signal.SIG_IGN)
for line in sys.stdin:
    op, group = line.split()
    (groups.add if op == "+" else groups.discard)(int(group))
reap()
"""


class Reaper:
    """A helper process that SIGKILLs registered process groups once its stdin closes: when
    this process ends, however it ends (a parent-death signal reaches only direct children;
    this reaches what they started too, e.g. `sh -c 'a & b'`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _send(self, line: str) -> None:
        with self._lock:
            stdin = self._proc.stdin
            if stdin is not None and not stdin.closed:
                with contextlib.suppress(OSError):
                    stdin.write(line.encode())
                    stdin.flush()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        self._send(f"+ {proc.pid}\n")

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        self._send(f"- {proc.pid}\n")

    def close(self) -> None:
        """Kill whatever is still registered, and end the reaper."""
        with self._lock:
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(10)
