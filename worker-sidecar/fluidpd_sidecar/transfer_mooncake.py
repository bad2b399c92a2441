"""``MooncakeTransfer``: the P/D KV hand-off over mooncake-transfer-engine, real bytes over TCP.

The flow is SGLang's (its ``disaggregation/mooncake`` backend uses the same engine): the decode
side ``reserve``s room in its registered arena and tells the prefill side where (its
``session`` plus the address, a ``KVDest``); the prefill side stages its prefix KV in its own
registered arena (``source_buffer``; real engines copy GPU KV to host memory first), writes it
with ``send`` (a one-sided write: the receiver's CPU does nothing per transfer) and then tells
the decode side it is done over the sidecars' own control channel. The engine does not notify
the receiver, exactly as in SGLang, where P sends a zmq status message after the write.

Mooncake API used (``mooncake.engine.TransferEngine``, wheel ``mooncake-transfer-engine`` or
``mooncake-transfer-engine-non-cuda``, 0.3.13):

* ``initialize(local_hostname, "P2PHANDSHAKE", "tcp", "")`` -> 0 on success. With the
  ``P2PHANDSHAKE`` metadata "server" there is no etcd/HTTP metadata service: each engine listens
  on an RPC port it picks itself (a port given in ``local_hostname`` is ignored), and peers
  exchange segment descriptors directly on first contact.
* ``get_rpc_port()``: that port; a peer reaches this engine as ``f"{hostname}:{rpc_port}"``
  (the ``session``, Mooncake's "target_hostname"/segment name).
* ``register_memory(addr, nbytes)`` / ``unregister_memory(addr)`` -> 0 on success. The
  receiving engine rejects writes that fall outside its registered buffers (rc -1).
* ``transfer_sync_write(session, local_addr, peer_addr, nbytes)`` -> 0 on success, negative on
  failure (peer unreachable, unknown session, address outside the peer's registration, peer
  gone mid-transfer). It blocks, releasing the GIL, until the peer acknowledges the write; a
  stalled peer makes it fail after ``MC_TCP_PROGRESS_TIMEOUT_SEC`` (30 s by default) without
  progress, so it does not hang forever.

The module imports without mooncake (the ``sim`` sidecar never needs it): the package is imported
lazily when a ``MooncakeTransfer`` is built.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fluidpd_sidecar.arena import (
    DEFAULT_ALIGN,
    ArenaSlots,
    FirstFitAllocator,
    TransferError,
)
from fluidpd_sidecar.transfer import KVDest

if TYPE_CHECKING:
    from types import TracebackType

log = logging.getLogger(__name__)

MOONCAKE_PIP = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
MOONCAKE_APT = "libibverbs1 libnuma1"
PAGE = mmap.PAGESIZE

# Arenas that ``close`` could not release because a transfer was still running on an engine
# thread: kept referenced for the life of the process, because freeing memory that the engine
# may still read or write would be a use-after-free inside C++ (a crash, not an exception).
_LEAKED: list[object] = []


class MooncakeUnavailableError(ImportError):
    """The mooncake package (or a system library its extension needs) is missing."""


class _Engine(Protocol):
    """The part of ``mooncake.engine.TransferEngine`` used here (the extension has no stubs)."""

    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, /
    ) -> int: ...

    def get_rpc_port(self) -> int: ...

    def register_memory(self, buffer_addr: int, capacity: int, /) -> int: ...

    def unregister_memory(self, buffer_addr: int, /) -> int: ...

    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, /
    ) -> int: ...


def _new_engine() -> _Engine:
    """Import mooncake only now, so that the sidecar imports and runs without it."""
    try:
        from mooncake.engine import TransferEngine  # noqa: PLC0415
    except ImportError as exc:
        # A missing libibverbs/libnuma surfaces as an ImportError of engine.so, not as a
        # missing module; name both fixes so that either case is a one-line repair.
        raise MooncakeUnavailableError(
            f"MooncakeTransfer needs the mooncake transfer engine: pip install {MOONCAKE_PIP} "
            f"(or mooncake-transfer-engine on CUDA hosts); its extension also needs the "
            f"system libraries {MOONCAKE_APT} (apt-get install -y {MOONCAKE_APT}). "
            f"Import failed with: {exc}"
        ) from exc
    engine: _Engine = TransferEngine()
    return engine


class MooncakeTransfer(ArenaSlots):
    """A ``KVTransfer`` that moves real bytes with Mooncake's TCP transport.

    Each instance owns one ``TransferEngine`` (one listening RPC port and TCP transport) and
    one page-aligned host arena registered with it; reservations (decode side) and staging
    buffers (prefill side) are both slots of that arena. A sidecar process should build one
    and share it, since every engine costs ports and transport threads.
    """

    name = "mooncake"

    def __init__(
        self,
        hostname: str = "127.0.0.1",
        arena_bytes: int = 1 << 30,
        *,
        align: int = DEFAULT_ALIGN,
        prefault: bool = True,
    ) -> None:
        if ":" in hostname:
            # P2PHANDSHAKE picks the port itself and the session is "host:port"; a port (or
            # an IPv6 literal) here would make the session ambiguous.
            raise ValueError(f"hostname must be a host name or IPv4 address, got {hostname!r}")
        if arena_bytes <= 0:
            raise ValueError(f"arena_bytes must be positive (got {arena_bytes})")
        self.hostname = hostname
        self.arena_bytes = -(-arena_bytes // PAGE) * PAGE
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._closed = False
        self._alloc = FirstFitAllocator(self.arena_bytes, align)

        engine = _new_engine()
        rc = engine.initialize(hostname, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise TransferError(f"TransferEngine.initialize({hostname!r}, tcp) returned {rc}")

        # Over-allocate by a page and slice, so that the arena is page-aligned whatever numpy's
        # allocator returns (registration and any later RDMA path want page alignment).
        raw = np.zeros(self.arena_bytes + PAGE, dtype=np.uint8)
        skip = -raw.ctypes.data % PAGE
        self._arena: np.ndarray[Any, np.dtype[np.uint8]] = raw[skip : skip + self.arena_bytes]
        if prefault:
            # np.zeros maps pages lazily; touching them now keeps page faults out of the first
            # transfers (they land on the transport's threads and inflate the first hand-off).
            self._arena.fill(0)
        self.base = int(self._arena.ctypes.data)
        rc = engine.register_memory(self.base, self.arena_bytes)
        if rc != 0:
            raise TransferError(f"TransferEngine.register_memory({self.arena_bytes} B) -> {rc}")
        self._engine: _Engine | None = engine
        self.session = f"{hostname}:{engine.get_rpc_port()}"

    async def send(self, src_addr: int | None, dest: KVDest | None, nbytes: int) -> float:
        """Write ``nbytes`` from this arena to ``dest``; returns the seconds the write took.

        The blocking Mooncake call runs on a worker thread (it releases the GIL), so the
        sidecar's event loop keeps scheduling while the bytes move.
        """
        if src_addr is None or dest is None:
            raise ValueError("MooncakeTransfer moves real bytes: src_addr and dest are required")
        if not 0 <= nbytes <= dest.nbytes:
            raise ValueError(f"nbytes {nbytes} does not fit the reservation {dest}")
        # Mooncake's TCP transport reads the local side without checking its registration, so
        # a stray source address would read arbitrary memory (or crash): check it here.
        self._offset(src_addr, nbytes)
        if nbytes == 0:
            return 0.0
        return await asyncio.to_thread(self.write, src_addr, dest, nbytes)

    def write(self, src_addr: int, dest: KVDest, nbytes: int) -> float:
        # The in-flight count is taken on the worker thread, not before submitting: a send
        # cancelled before its thread starts never runs, so it must never have been counted.
        with self._lock:
            if self._closed or self._engine is None:
                raise TransferError("MooncakeTransfer is closed")
            engine = self._engine
            self._inflight += 1
        try:
            start = time.perf_counter()
            rc = engine.transfer_sync_write(dest.session, src_addr, dest.addr, nbytes)
            seconds = time.perf_counter() - start
        finally:
            with self._lock:
                self._inflight -= 1
                self._idle.notify_all()
        if rc != 0:
            raise TransferError(
                f"transfer_sync_write of {nbytes} B to {dest.session} @ {dest.addr:#x} failed "
                f"(rc {rc}): peer unreachable or gone, unknown session, or the address is "
                f"outside its registered memory; Mooncake's log on stderr has the cause"
            )
        return seconds

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, timeout_s: float = 60.0) -> None:
        """Unregister the arena and shut the engine down, after in-flight writes finish."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            drained = self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)
            engine, self._engine = self._engine, None
        if not drained:
            # A write still running on an engine thread may touch the arena and the engine:
            # keep both alive forever rather than free them under it.
            log.warning("MooncakeTransfer.close: transfers still running after %ss", timeout_s)
            _LEAKED.extend([engine, self._arena])
            return
        if engine is not None:
            rc = engine.unregister_memory(self.base)
            if rc != 0:
                log.warning("unregister_memory(%#x) returned %d", self.base, rc)
        # Dropping the last reference runs the engine's destructor (stops its RPC listener and
        # transport threads); the arena stays valid for views a caller may still hold.
        del engine

    def __enter__(self) -> MooncakeTransfer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
