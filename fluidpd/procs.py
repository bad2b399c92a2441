"""Processes: whether one is still running (the local stack's orphan checks, the shm transport's
sweep of arenas that SIGKILLed sidecars left behind), children that die with their launcher,
stopping children, and waiting for a child's HTTP endpoint to answer."""

from __future__ import annotations

import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def alive(pid: int) -> bool:
    """Running. A zombie nobody has reaped yet counts as gone; another user's process (which
    we may not signal) counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which may itself hold spaces and parentheses.
    return text.rsplit(")", 1)[1].split()[0] != "Z"


# -- child processes of a launcher --------------------------------------------------------------
# `fluidpd up`, the drills' local stack and the e2e harness's kubelet all start children that
# must not outlive them, stop them, and wait for a child's HTTP endpoint to answer: one way each.

_PR_SET_PDEATHSIG = 1

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc Linux: children then outlive a SIGKILLed parent
    _LIBC = None


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get ``sig`` when the spawning thread dies, however
    it dies (Linux parent-death signal). Only a call into the already-loaded libc, so it is safe
    in a process that has threads."""

    def hook() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, sig)

    return hook


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = True,
    death_signal: signal.Signals = signal.SIGTERM,
    new_session: bool = False,
    stdin: int | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr in ``log_path`` (appended to, or truncated when
    not ``append``), getting ``death_signal`` when the calling thread dies (spawn from a thread
    that lives as long as the child should). ``new_session``: its own process group, so a
    launcher can signal what it starts in turn. ``pass_fds``: descriptors the child inherits
    (a listening socket, ``fluidpd.listeners``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The child has its own copy of the descriptor: the launcher's can close at once.
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=new_session,
            pass_fds=tuple(pass_fds),
            preexec_fn=die_with_parent(death_signal),  # noqa: PLW1509
        )


def stop(children: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """Stop ``children``: SIGTERM each one still running, in the order given (a launcher
    names the order its parts must stop in), then give them ``timeout`` seconds between them
    to exit; SIGKILL whatever is left, and reap every one (no zombie stays behind)."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    # One deadline for all: they exit concurrently, so stopping N takes timeout, not N x.
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def http_ok(
    url: str,
    timeout: float = 1.0,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> bool:
    """One GET: did ``url`` answer 200? Refused, reset and timed-out connections are a no."""
    # urllib, not aiohttp (FluidPD's HTTP client everywhere else): the launchers poll from
    # synchronous code (``fluidpd up``, the drills' stack, the e2e harness's kubelet), where an
    # event loop per probe would only add cost; this is the one synchronous client.
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_http(
    url: str,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> bool:
    """Poll ``url`` until it answers 200 (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if http_ok(url, 1.0, headers, context):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
