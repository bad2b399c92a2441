"""The host arena both KV transports stage hand-offs in: a first-fit allocator over one
contiguous buffer, and the slot bookkeeping (receiver reservations, sender staging buffers,
views) that ``MooncakeTransfer`` and ``ShmTransfer`` share; they differ only in how the arena
is made and how bytes reach the peer's."""

from __future__ import annotations

import asyncio
import bisect
import threading
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from fluidpd_sidecar.engine import KVRegion
from fluidpd_sidecar.transfer import KVDest

DEFAULT_ALIGN = 4096


class TransferError(RuntimeError):
    """A transfer failed (bad session, unreachable or dead peer, rejected address)."""


class FirstFitAllocator:
    """First-fit over ``[0, size)`` with ``align``-rounded blocks; frees coalesce neighbours.

    KV hand-offs are few and large (one block per in-flight request), so a sorted free list
    scanned linearly is simpler than a buddy or slab allocator and fast enough.
    """

    def __init__(self, size: int, align: int = DEFAULT_ALIGN) -> None:
        if size <= 0 or align <= 0:
            raise ValueError(f"size and align must be positive (got {size}, {align})")
        self.size = size
        self.align = align
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, length), sorted, disjoint
        self._used: dict[int, int] = {}  # offset -> rounded length

    def _round(self, nbytes: int) -> int:
        return -(-nbytes // self.align) * self.align

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a free block of at least ``nbytes``, or None if none is large enough."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive (got {nbytes})")
        need = self._round(nbytes)
        for i, (off, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[i]
                else:
                    self._free[i] = (off + need, length - need)
                self._used[off] = need
                return off
        return None

    def free(self, offset: int) -> None:
        length = self._used.pop(offset, None)
        if length is None:
            raise ValueError(f"offset {offset} is not allocated (double free?)")
        i = bisect.bisect_left(self._free, (offset, 0))
        # Merge with the following and the preceding free block so that a full arena that
        # drains becomes one block again (no fragmentation left behind by a burst).
        if i < len(self._free) and offset + length == self._free[i][0]:
            length += self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            offset, length = self._free[i - 1][0], self._free[i - 1][1] + length
            i -= 1
            del self._free[i]
        self._free.insert(i, (offset, length))

    def block_size(self, offset: int) -> int:
        """The rounded length of an allocated block (KeyError if not allocated)."""
        return self._used[offset]

    @property
    def free_bytes(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def largest_free(self) -> int:
        return max((length for _, length in self._free), default=0)


class ArenaSlots(ABC):
    """Reservations and staging buffers as blocks of one arena at ``base``.

    The subclass builds the arena and sets ``arena_bytes``, ``base``, ``session``, ``_arena``,
    ``_alloc``, ``_lock`` and ``_closed``.
    """

    arena_bytes: int
    base: int
    session: str
    _arena: np.ndarray[Any, np.dtype[np.uint8]]
    _alloc: FirstFitAllocator
    _lock: threading.Lock
    _closed: bool

    # -- receiver side -------------------------------------------------------------------
    def reserve(self, nbytes: int) -> KVDest | None:
        """Room for an incoming KV inside the arena, or None while the arena is full."""
        off = self._take(nbytes)
        return None if off is None else KVDest(self.session, self.base + off, nbytes)

    def free(self, dest: KVDest) -> None:
        if dest.session != self.session:
            raise ValueError(f"{dest} was not reserved here ({self.session})")
        self._give_back(dest.addr)

    # -- sender side ---------------------------------------------------------------------
    @abstractmethod
    def write(self, src_addr: int, dest: KVDest, nbytes: int) -> float:
        """The blocking copy of ``nbytes`` at ``src_addr`` into the peer's ``dest``; seconds."""

    async def send(self, src_addr: int | None, dest: KVDest | None, nbytes: int) -> float:
        """``write`` on a worker thread (nothing to move: 0 s)."""
        if src_addr is None or dest is None or nbytes == 0:
            return 0.0
        return await asyncio.to_thread(self.write, src_addr, dest, nbytes)

    def source_buffer(self, nbytes: int) -> KVRegion | None:
        """A staging region for outgoing bytes, or None while the arena is full."""
        off = self._take(nbytes)
        return None if off is None else KVRegion(self.base + off, nbytes)

    def release_source(self, region: KVRegion) -> None:
        self._give_back(region.addr)

    def view(self, addr: int, nbytes: int) -> memoryview:
        """A writable view of ``nbytes`` of the arena at ``addr`` (to fill or to read KV)."""
        off = self._offset(addr, nbytes)
        return self._arena[off : off + nbytes].data

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return self._alloc.free_bytes

    # -- helpers -------------------------------------------------------------------------
    def _take(self, nbytes: int) -> int | None:
        with self._lock:
            if self._closed:
                raise TransferError(f"{type(self).__name__} is closed")
            return self._alloc.alloc(nbytes)

    def _give_back(self, addr: int) -> None:
        with self._lock:
            self._alloc.free(addr - self.base)

    def _offset(self, addr: int, nbytes: int) -> int:
        off = addr - self.base
        if nbytes < 0 or off < 0 or off + nbytes > self.arena_bytes:
            raise ValueError(
                f"[{addr:#x}, +{nbytes}) is outside this arena "
                f"[{self.base:#x}, +{self.arena_bytes})"
            )
        return off
