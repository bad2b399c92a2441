"""``ShmTransfer``: the P/D KV hand-off between sidecars on one host, through shared memory.

Same flow and interface as ``MooncakeTransfer`` (reserve on the decode side, stage in a
source buffer on the prefill side, one-sided ``send``, then the control-channel hand-off
message), but the arenas are files in ``/dev/shm`` that the sender maps and writes with one
memcpy. It needs no extension and no system library, which is why the GPU machine uses it:
that machine takes at most 64 MiB of carried files per command, and the mooncake wheel plus
the serving stack's wheels do not fit beside the repository. An engine that copies KV from
the GPU registers the arena as pinned memory (``cudaHostRegister``), so GPU <-> arena copies
are DMA at PCIe speed and the hand-off is staged through pinned host memory exactly like
mooncake's TCP path. The ``session`` is ``<file name>@<arena base address>``: the sender
turns the receiver's address back into an offset of the mapped file.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fluidpd.procs import alive
from fluidpd_sidecar.arena import ArenaSlots, FirstFitAllocator, TransferError
from fluidpd_sidecar.transfer import KVDest

SHM_DIR = Path("/dev/shm")
#: MAP_POPULATE pre-faults the mapping: without it the first hand-off into each page pays a
#: page fault per 4 KiB in the copying process (measured on the H200 machine: 1.1 GB/s).
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def sweep_dead_arenas(directory: Path) -> list[Path]:
    """Unlinks arenas whose creating process is gone (SIGKILLed sidecars leave theirs: a
    worker's worth of host memory each); returns what was removed."""
    removed = []
    for path in directory.glob("fluidpd-kv-*-*"):
        pid = path.name.split("-")[2]
        if not pid.isdigit() or alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError, PermissionError):
            path.unlink()
            removed.append(path)
    return removed


class ShmTransfer(ArenaSlots):
    name = "shm"

    def __init__(self, arena_bytes: int, directory: Path = SHM_DIR) -> None:
        if arena_bytes <= 0:
            raise ValueError(f"arena_bytes must be positive (got {arena_bytes})")
        self.arena_bytes = arena_bytes
        sweep_dead_arenas(directory)
        self.path = directory / f"fluidpd-kv-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, arena_bytes)
            self._mm = mmap.mmap(fd, arena_bytes, flags=_FLAGS)
        finally:
            os.close(fd)
        self._arena = np.frombuffer(self._mm, dtype=np.uint8)
        self.base = int(self._arena.ctypes.data)
        self.session = f"{self.path.name}@{self.base}"
        self._alloc = FirstFitAllocator(arena_bytes)
        self._lock = threading.Lock()
        self._peers: dict[str, tuple[mmap.mmap, np.ndarray, int]] = {}
        self._closed = False
        # The arena lives in memory (tmpfs) until unlinked: removed by ``close`` (the sidecar
        # calls it on shutdown) or at interpreter exit; a SIGKILLed process leaves it behind
        # until the next sidecar on the host sweeps it.
        atexit.register(self.close)

    def write(self, src_addr: int, dest: KVDest, nbytes: int) -> float:
        """The blocking copy (numpy releases the GIL for it); seconds taken."""
        if nbytes > dest.nbytes:
            raise TransferError(f"{nbytes} B do not fit the {dest.nbytes} B reserved")
        t0 = time.perf_counter()
        peer, base = self._peer(dest.session)
        off = dest.addr - base
        if off < 0 or off + nbytes > peer.size:
            raise TransferError(f"address {dest.addr:#x} outside peer arena {dest.session}")
        src = self._offset(src_addr, nbytes)
        peer[off : off + nbytes] = self._arena[src : src + nbytes]
        return time.perf_counter() - t0

    @contextlib.contextmanager
    def peer_view(self, session: str, addr: int, nbytes: int) -> Iterator[memoryview]:
        """Pull: ``nbytes`` of a peer's arena at ``addr``, read in place (its file, mapped)."""
        peer, base = self._peer(session)
        off = addr - base
        if nbytes < 0 or off < 0 or off + nbytes > peer.size:
            raise TransferError(f"address {addr:#x} outside peer arena {session}")
        yield peer[off : off + nbytes].data

    def _peer(self, session: str) -> tuple[np.ndarray, int]:
        name, _, base = session.rpartition("@")
        if not name or "/" in name or not base.isdigit():
            raise TransferError(f"bad shm session {session!r}")
        with self._lock:
            hit = self._peers.get(session)
            if hit is None:
                try:
                    fd = os.open(self.path.parent / name, os.O_RDWR)
                except OSError as exc:
                    raise TransferError(f"peer arena {name} not reachable: {exc}") from exc
                try:
                    mm = mmap.mmap(fd, 0, flags=_FLAGS)
                finally:
                    os.close(fd)
                hit = (mm, np.frombuffer(mm, dtype=np.uint8), int(base))
                self._peers[session] = hit
        return hit[1], hit[2]

    # -- bookkeeping ---------------------------------------------------------------------------
    def close(self) -> None:
        """Unlinks the arena file (mappings stay valid until the process lets go of them)."""
        if not self._closed:
            self._closed = True
            self.path.unlink(missing_ok=True)

    def __del__(self) -> None:
        self.close()
