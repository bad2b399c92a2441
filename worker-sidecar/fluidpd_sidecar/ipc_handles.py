"""Lifetimes of the peer memory a process maps for the ``cuda-ipc`` KV transport.

The transport (``transfer_cuda_ipc.py``) pushes KV like ``shm`` does: each sidecar exports one
IPC handle of its device arena for its whole life (its ``session``), a receiver reserves a slot
in it, and the sender maps the receiver's arena once and copies into the slot GPU to GPU. The
CUDA part is three calls (export, open, close); everything that decides *when* they happen is
here, free of CUDA so that it runs and is tested on any machine:

* A mapping pins the peer's whole arena: CUDA frees an allocation only when its exporter has
  freed it *and* every importer has closed its mapping, so a receiver SIGKILLed while a sender
  still maps it leaves gigabytes of GPU memory allocated until the sender lets go. Hence
  ``PeerMaps.sweep`` closes the mapping of every peer seen dead (its pid gone, or reused by a
  process that started at another time) and of every peer unused for ``idle_close_s``; the
  transport runs it every second on a thread of its own, and before each copy.
* A mapping is never closed under a running copy: ``acquire``/``release`` count users, and a
  mapping closed while in use (a sweep, ``close_all``) goes when its last user releases it.
* A peer's own slots (its reservations, this side's staging buffers) are bytes of one arena
  allocated once per process, so they cannot leak GPU memory: the sidecar frees a reservation
  when the engine has loaded it, when the request ends, or at its bootstrap timeout (a sender
  that died mid-hand-off), exactly as for ``shm``; a process that dies takes its arena along
  once its importers have swept it.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from fluidpd_sidecar.arena import TransferError

PREFIX = "cuda-ipc"
M = TypeVar("M")


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    None if there is no such process or it is a zombie. With the pid it names one process for
    good: a pid reused after a crash has another start time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces and ")"
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True, slots=True)
class IpcSession:
    """What a peer's ``session`` string says: which process exports the arena, its device
    address (a ``KVDest.addr`` is ``base`` plus an offset), and the backend's opaque handle."""

    pid: int
    start: int
    base: int
    payload: str

    def encode(self) -> str:
        return f"{PREFIX}:{self.pid}:{self.start}:{self.base}:{self.payload}"

    @staticmethod
    def parse(text: str) -> IpcSession:
        parts = text.split(":", 4)
        if len(parts) != 5 or parts[0] != PREFIX or not all(p.isdigit() for p in parts[1:4]):
            raise TransferError(f"bad cuda-ipc session {text[:80]!r}")
        return IpcSession(int(parts[1]), int(parts[2]), int(parts[3]), parts[4])

    def alive(self) -> bool:
        return process_start(self.pid) == self.start


def own_session(base: int, payload: bytes) -> IpcSession:
    start = process_start(os.getpid())
    assert start is not None  # this process is running
    return IpcSession(os.getpid(), start, base, base64.urlsafe_b64encode(payload).decode())


class IpcBackend(Protocol[M]):
    """The CUDA calls: map a peer's exported arena (``IpcSession.payload``), and unmap it."""

    def open(self, session: IpcSession) -> M: ...

    def close(self, mapping: M) -> None: ...


@dataclass(slots=True, eq=False)
class Mapped(Generic[M]):
    """One peer arena mapped here: what ``acquire`` lends for a copy (``release`` it after)."""

    key: str
    session: IpcSession
    mapping: M
    last_used: float
    users: int = 0
    #: Out of the table: closed as soon as its last user releases it (the peer died, the
    #: mapping failed a copy, or ``close_all``).
    doomed: bool = False


@dataclass(slots=True)
class MapStats:
    opened: int = 0
    closed: int = 0
    #: Doomed because the peer was seen dead / unused too long / a copy through it failed.
    closed_dead: int = 0
    closed_idle: int = 0
    closed_failed: int = 0


class PeerMaps(Generic[M]):
    """The importer side: peer arenas mapped by this process, one mapping per peer session."""

    def __init__(
        self,
        backend: IpcBackend[M],
        idle_close_s: float = 60.0,
        alive: Callable[[IpcSession], bool] = IpcSession.alive,
    ) -> None:
        if idle_close_s <= 0:
            raise ValueError(f"idle_close_s must be positive (got {idle_close_s})")
        self._backend = backend
        self._idle = idle_close_s
        self._alive = alive
        self._lock = threading.Lock()
        self._maps: dict[str, Mapped[M]] = {}
        #: Doomed while in use: closed by the last ``release``.
        self._doomed: list[Mapped[M]] = []
        self._closed = False
        self.stats = MapStats()

    @property
    def open_sessions(self) -> list[str]:
        """Sessions with a live mapping (not counting doomed ones still in use)."""
        with self._lock:
            return list(self._maps)

    @property
    def mapped(self) -> int:
        """Mappings not closed yet, doomed ones still in use included."""
        with self._lock:
            return len(self._maps) + len(self._doomed)

    def acquire(self, session: str, now: float) -> Mapped[M]:
        """The mapping of ``session`` for one copy (opened on first use); ``release`` it after.
        Raises ``TransferError`` when the peer is gone or its handle cannot be opened."""
        with self._lock:
            if self._closed:
                raise TransferError("the cuda-ipc transport is closed")
            hit = self._maps.get(session)
            if hit is not None:
                hit.users += 1
                hit.last_used = now
                return hit
        parsed = IpcSession.parse(session)
        if not self._alive(parsed):
            raise TransferError(f"cuda-ipc peer pid {parsed.pid} is gone")
        # Opened outside the lock (a CUDA call that may take milliseconds); a second thread
        # racing for the same new session opens its own mapping, and the loser closes it.
        try:
            mapping = self._backend.open(parsed)
        except Exception as exc:
            raise TransferError(f"cuda-ipc handle of pid {parsed.pid} not opened: {exc}") from exc
        with self._lock:
            hit = self._maps.get(session)
            if hit is None and not self._closed:
                hit = self._maps[session] = Mapped(session, parsed, mapping, now, users=1)
                self.stats.opened += 1
                return hit
            if hit is not None:
                hit.users += 1
                hit.last_used = now
        self._backend.close(mapping)
        self.stats.opened += 1
        self._count_closed()
        if hit is None:
            raise TransferError("the cuda-ipc transport is closed")
        return hit

    def release(self, lease: Mapped[M], now: float, failed: bool = False) -> None:
        """One copy through ``lease`` is done; ``failed``: it failed, so the mapping is not
        trusted again (the next copy reopens it, or finds the peer dead)."""
        with self._lock:
            lease.users -= 1
            lease.last_used = now
            if failed and not lease.doomed:
                self.stats.closed_failed += 1
                self._doom(lease)
            gone = self._take_if_unused(lease)
        if gone:
            self._close(lease)

    def sweep(self, now: float) -> list[str]:
        """Dooms the mappings of dead peers and those unused for ``idle_close_s`` (closed now,
        or when their running copy ends); returns their sessions."""
        with self._lock:
            entries = list(self._maps.values())
        # Liveness reads /proc: outside the lock.
        dead = [m for m in entries if not self._alive(m.session)]
        closing, swept = [], []
        with self._lock:
            for m in entries:
                if m.doomed or self._maps.get(m.key) is not m:
                    continue
                if m in dead:
                    self.stats.closed_dead += 1
                elif m.users == 0 and now - m.last_used >= self._idle:
                    self.stats.closed_idle += 1
                else:
                    continue
                self._doom(m)
                swept.append(m.key)
                if self._take_if_unused(m):
                    closing.append(m)
        for m in closing:
            self._close(m)
        return swept

    def close_all(self) -> None:
        """Transport shutdown: every mapping goes (those in use when their copy ends)."""
        with self._lock:
            self._closed = True
            closing = []
            for m in list(self._maps.values()):
                self._doom(m)
                if self._take_if_unused(m):
                    closing.append(m)
        for m in closing:
            self._close(m)

    # -- helpers (``_doom`` and ``_take_if_unused`` with the lock held) --------------------------
    def _doom(self, m: Mapped[M]) -> None:
        m.doomed = True
        if self._maps.get(m.key) is m:
            del self._maps[m.key]
        self._doomed.append(m)

    def _take_if_unused(self, m: Mapped[M]) -> bool:
        if m.doomed and m.users <= 0 and m in self._doomed:
            self._doomed.remove(m)
            return True
        return False

    def _close(self, m: Mapped[M]) -> None:
        try:
            self._backend.close(m.mapping)
        finally:
            self._count_closed()

    def _count_closed(self) -> None:
        with self._lock:
            self.stats.closed += 1
