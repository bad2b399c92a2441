"""The ``cuda-ipc`` transport on a machine without CUDA: it refuses at start, in one line, and
its handle lifetimes (``ipc_handles.PeerMaps``) hold with the CUDA calls replaced by their
closest CPU twin, which is real and cross-process: a peer process exports "its arena" as a
/dev/shm file it unlinks at once (like device memory, it then lives as long as someone maps
it), this process maps it. A peer SIGKILLed while mapped here leaves its memory allocated
until this side lets go, exactly what a dead CUDA IPC exporter does to its importers. The
real CUDA path (bandwidth, the migrate drain, a SIGKILLed peer's GPU memory coming back) is
measured by ``scripts/gpu/kv_ipc_live.sh`` on the GPU machine.
"""

from __future__ import annotations

import base64
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fluidpd_sidecar.arena import TransferError
from fluidpd_sidecar.ipc_handles import IpcSession, PeerMaps, process_start
from fluidpd_sidecar.transfer_cuda_ipc import CudaIpcTransfer, CudaIpcUnavailableError

HAS_CUDA = torch.cuda.is_available()

NEEDS = "--kv-transfer cuda-ipc needs a CUDA device"
ARENA = 1 << 20

# The peer: makes an "arena" (a /dev/shm file, unlinked once open), fills it with its pid's
# byte, prints its session, then waits to be killed.
PEER = """
import mmap, os, sys, tempfile, time
from fluidpd_sidecar.ipc_handles import own_session
fd, path = tempfile.mkstemp(prefix="fluidpd-ipc-test-", dir="/dev/shm")
os.ftruncate(fd, {arena})
mm = mmap.mmap(fd, {arena})
mm[:] = bytes([os.getpid() % 251]) * {arena}
print(own_session(0, str(fd).encode() + b":" + path.encode()).encode(), flush=True)
time.sleep(0.5)  # the importer opens /proc/<pid>/fd/<fd> meanwhile
os.unlink(path)
time.sleep(600)
"""


class ShmTwin:
    """``IpcBackend`` over the peer's /dev/shm file: ``open`` maps it through the peer's open
    descriptor (as ``cudaIpcOpenMemHandle`` maps the peer's allocation), ``close`` unmaps."""

    def __init__(self) -> None:
        self.open_maps: list[mmap.mmap] = []

    def open(self, session: IpcSession) -> mmap.mmap:
        fd, _, _ = base64.urlsafe_b64decode(session.payload).decode().partition(":")
        with open(f"/proc/{session.pid}/fd/{fd}", "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        self.open_maps.append(mm)
        return mm

    def close(self, mapping: mmap.mmap) -> None:
        self.open_maps.remove(mapping)
        mapping.close()


def _mapped_peer_files() -> list[str]:
    """This process's mappings of peers' arenas (what keeps a dead peer's memory allocated)."""
    text = Path("/proc/self/maps").read_text()
    return [line for line in text.splitlines() if "fluidpd-ipc-test-" in line]


@pytest.fixture()
def peer() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER.format(arena=ARENA)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    session = proc.stdout.readline().strip()
    try:
        yield proc, session
    finally:
        proc.kill()
        proc.wait(10)


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_mapping_is_opened_once_and_reused(peer: tuple[subprocess.Popen[str], str]) -> None:
    proc, session = peer
    twin = ShmTwin()
    maps = PeerMaps(twin)
    a = maps.acquire(session, 0.0)
    assert a.mapping[:4] == bytes([proc.pid % 251]) * 4  # the peer's bytes, read here
    maps.release(a, 1.0)
    b = maps.acquire(session, 2.0)
    maps.release(b, 3.0)
    assert b is a and maps.stats.opened == 1 and len(twin.open_maps) == 1
    maps.close_all()
    assert twin.open_maps == [] and maps.stats.closed == 1
    with pytest.raises(TransferError, match="closed"):
        maps.acquire(session, 4.0)


def test_a_sigkilled_peer_is_swept_and_its_memory_unmapped(
    peer: tuple[subprocess.Popen[str], str],
) -> None:
    proc, session = peer
    twin = ShmTwin()
    maps = PeerMaps(twin, idle_close_s=3600)
    maps.release(maps.acquire(session, 0.0), 0.0)
    time.sleep(0.7)  # the peer has unlinked its file: only the mappings keep it allocated
    assert maps.sweep(1.0) == []  # alive: kept
    _kill(proc)
    assert _mapped_peer_files(), "the dead peer's memory is still mapped here"
    assert maps.sweep(2.0) == [session]
    assert twin.open_maps == [] and _mapped_peer_files() == []
    assert maps.stats.closed_dead == 1 and maps.open_sessions == []
    with pytest.raises(TransferError, match=f"pid {proc.pid} is gone"):
        maps.acquire(session, 3.0)


def test_a_mapping_in_use_is_closed_when_its_copy_ends(
    peer: tuple[subprocess.Popen[str], str],
) -> None:
    proc, session = peer
    twin = ShmTwin()
    maps = PeerMaps(twin)
    lease = maps.acquire(session, 0.0)
    _kill(proc)
    assert maps.sweep(1.0) == [session]
    # The copy still running through it must not lose its memory under it.
    assert len(twin.open_maps) == 1 and maps.mapped == 1 and maps.open_sessions == []
    assert lease.mapping[:1] == bytes([proc.pid % 251])
    maps.release(lease, 2.0)
    assert twin.open_maps == [] and maps.mapped == 0


def test_idle_mappings_are_closed_and_reopened_on_use(
    peer: tuple[subprocess.Popen[str], str],
) -> None:
    _, session = peer
    twin = ShmTwin()
    maps = PeerMaps(twin, idle_close_s=10.0)
    busy = maps.acquire(session, 0.0)
    assert maps.sweep(100.0) == []  # in use: not idle, whatever the clock says
    maps.release(busy, 100.0)
    assert maps.sweep(105.0) == []
    assert maps.sweep(110.0) == [session] and twin.open_maps == []
    assert maps.stats.closed_idle == 1
    maps.release(maps.acquire(session, 111.0), 111.0)
    assert maps.stats.opened == 2 and len(twin.open_maps) == 1
    maps.close_all()


def test_a_failed_copy_drops_the_mapping(peer: tuple[subprocess.Popen[str], str]) -> None:
    _, session = peer
    twin = ShmTwin()
    maps = PeerMaps(twin)
    first = maps.acquire(session, 0.0)
    other = maps.acquire(session, 0.0)  # a second copy in flight through the same mapping
    maps.release(first, 1.0, failed=True)
    assert maps.open_sessions == [] and len(twin.open_maps) == 1  # ``other`` still copies
    fresh = maps.acquire(session, 1.5)
    assert fresh is not first and maps.stats.opened == 2
    maps.release(other, 2.0)
    maps.release(fresh, 2.0)
    assert len(twin.open_maps) == 1 and maps.stats.closed_failed == 1
    maps.close_all()
    assert twin.open_maps == []


def test_sessions_name_one_process_for_good() -> None:
    start = process_start(os.getpid())
    assert start is not None
    me = IpcSession(os.getpid(), start, 4096, "eA==")
    assert IpcSession.parse(me.encode()) == me and me.alive()
    # The same pid with another start time: a reused pid, not the peer that exported.
    assert not IpcSession(os.getpid(), start + 1, 4096, "eA==").alive()
    for bad in ("shm-file@123", "cuda-ipc:1:2:x:y", "cuda-ipc:1:2"):
        with pytest.raises(TransferError, match="bad cuda-ipc session"):
            IpcSession.parse(bad)
    with pytest.raises(ValueError, match="idle_close_s"):
        PeerMaps(ShmTwin(), idle_close_s=0)


@pytest.mark.skipif(HAS_CUDA, reason="the refusal is for machines without a CUDA device")
def test_the_transport_refuses_to_start_without_cuda() -> None:
    for device in ("cuda", "cuda:0", "cpu"):
        with pytest.raises(CudaIpcUnavailableError, match=NEEDS):
            CudaIpcTransfer(ARENA, device=device)


def _fluidpd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fluidpd")
    assert exe, "the fluidpd console script is not installed (pip install -e .)"
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


@pytest.mark.skipif(HAS_CUDA, reason="the refusal is for machines without a CUDA device")
@pytest.mark.parametrize(
    "args",
    [
        ("sidecar", "--id", "w0", "--role", "decode", "--kv-transfer", "cuda-ipc"),
        ("sidecar", "--id", "w0", "--role", "decode", "--engine", "gpu", "--device", "cpu",
         "--engine-model", "tiny", "--kv-transfer", "cuda-ipc"),
        ("up", "--pd", "1P1D", "--kv-transfer", "cuda-ipc", "--run-dir", "run"),
    ],
    ids=["sidecar-sim", "sidecar-gpu-on-cpu", "up"],
)  # fmt: skip
def test_the_cli_refuses_cuda_ipc_without_cuda_in_one_line(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    proc = _fluidpd(*args, cwd=tmp_path)
    assert proc.returncode != 0
    assert NEEDS in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "endpoint").exists()  # nothing was started
