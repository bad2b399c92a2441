"""``CudaIpcTransfer``: the P/D KV hand-off between sidecars on one host, GPU to GPU.

The same flow and interface as ``ShmTransfer`` (the decode side ``reserve``s a slot, the
prefill side stages its KV in a ``source_buffer`` slot, ``send`` copies, then the control
channel's hand-off message), but the arena is device memory: one allocation per sidecar, made
at start, whose CUDA IPC handle is the ``session``. A sender maps a receiver's arena once
(``cudaIpcOpenMemHandle`` through torch's ``UntypedStorage._new_shared_cuda``) and copies from
its slot into the receiver's with one device-to-device ``copy_`` on a stream of its own: no
host memory on the way, unlike ``shm``'s D2H, host memcpy and H2D. Peers may sit on one GPU
or on several GPUs of one host (the session names the arena's device by UUID, so differing
``CUDA_VISIBLE_DEVICES`` do not matter; a copy to another GPU goes peer to peer).

Why push (the sender writes into the receiver's slot) and not pull: it is the protocol
``shm`` and ``mooncake`` already speak (``KVDest`` in the reservation, the hand-off message
after the write), so reservations, backpressure and the engines' loading are unchanged, and
the receiver reads its slot only after the hand-off message, when the sender's copy is
complete (it synchronises its stream before returning).

Lifetimes (the bookkeeping is ``ipc_handles.PeerMaps``, tested on CPU): the arena is exported
once and freed with the process, so slots are bookkeeping only; a mapping of a peer's arena
is closed when the peer is seen dead (a background sweep each ``sweep_s``, and before each
copy), after ``idle_close_s`` unused, after a failed copy, and at ``close``; never under a
running copy. A receiver SIGKILLed while mapped would otherwise keep its whole arena allocated
on the GPU for as long as the sender lives.

Needs torch with CUDA and a CUDA ``--device``: ``cuda_device`` refuses anything else in one line.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from fluidpd_sidecar.arena import DEFAULT_ALIGN, ArenaSlots, FirstFitAllocator, TransferError
from fluidpd_sidecar.device_view import DeviceView
from fluidpd_sidecar.ipc_handles import IpcSession, PeerMaps, own_session
from fluidpd_sidecar.transfer import KVDest

log = logging.getLogger(__name__)

NEEDS_CUDA = "--kv-transfer cuda-ipc needs a CUDA device"


class CudaIpcUnavailableError(RuntimeError):
    """No CUDA device for the transport (CPU-only torch, no GPU, or a CPU ``--device``)."""


def cuda_device(device: str = "cuda") -> torch.device:
    """The CUDA device ``device`` names, or ``CudaIpcUnavailableError`` saying why not."""
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise CudaIpcUnavailableError(f"{NEEDS_CUDA}: bad --device {device!r} ({exc})") from None
    if dev.type != "cuda":
        raise CudaIpcUnavailableError(f"{NEEDS_CUDA} (--device is {device})")
    if not torch.cuda.is_available():
        raise CudaIpcUnavailableError(f"{NEEDS_CUDA}; torch sees none on this machine")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise CudaIpcUnavailableError(
            f"{NEEDS_CUDA}: --device {device} does not exist ({torch.cuda.device_count()} visible)"
        )
    return torch.device("cuda", index)


def _uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class TorchIpc:
    """The three CUDA calls, through torch's storage sharing (what ``torch.multiprocessing``
    does for a CUDA tensor put on a queue): export an allocation's handle, open a peer's,
    close it by dropping the last reference (torch then calls ``cudaIpcCloseMemHandle``)."""

    @staticmethod
    def export(arena: torch.Tensor) -> bytes:
        device, handle, size, offset, rc, rc_offset, event, sync = (
            arena.untyped_storage()._share_cuda_()  # type: ignore[no-untyped-call]
        )
        info = {
            "uuid": _uuid(int(device)),
            "handle": bytes(handle).hex(),
            "size": int(size),
            "offset": int(offset),
            "rc": bytes(rc).hex(),
            "rc_offset": int(rc_offset),
            "event": bytes(event).hex() if event else "",
            "sync": bool(sync),
        }
        return json.dumps(info).encode()

    def open(self, session: IpcSession) -> torch.Tensor:
        info = json.loads(base64.urlsafe_b64decode(session.payload))
        index = next(
            (i for i in range(torch.cuda.device_count()) if _uuid(i) == info["uuid"]), None
        )
        if index is None:
            raise TransferError(f"the peer's GPU {info['uuid']} is not visible here")
        storage = torch.UntypedStorage._new_shared_cuda(
            index,
            bytes.fromhex(info["handle"]),
            info["size"],
            info["offset"],
            bytes.fromhex(info["rc"]),
            info["rc_offset"],
            bytes.fromhex(info["event"]),
            info["sync"],
        )
        mapped = torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", index))
        mapped.set_(storage, 0, (storage.nbytes(),), (1,))
        return mapped

    def close(self, mapping: torch.Tensor) -> None:
        # Copies through it were synchronised before their lease was released. Pointing the
        # tensor at an empty storage drops the mapped one at once, whoever still holds the
        # tensor object, and torch closes the handle with its last reference.
        mapping.set_(torch.empty(0, dtype=torch.uint8, device=mapping.device).untyped_storage())


class CudaIpcTransfer(ArenaSlots):
    name = "cuda-ipc"
    #: The arena is device memory: the engine must not page-lock it, and reads it on the GPU.
    on_device = True

    def __init__(
        self,
        arena_bytes: int,
        device: str = "cuda",
        *,
        idle_close_s: float = 60.0,
        sweep_s: float = 1.0,
    ) -> None:
        if arena_bytes <= 0:
            raise ValueError(f"arena_bytes must be positive (got {arena_bytes})")
        self.device = cuda_device(device)
        self.arena_bytes = -(-arena_bytes // DEFAULT_ALIGN) * DEFAULT_ALIGN
        self._dev_arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=self.device)
        self.base = int(self._dev_arena.data_ptr())
        self.session = own_session(self.base, TorchIpc.export(self._dev_arena)).encode()
        self._alloc = FirstFitAllocator(self.arena_bytes)
        self._lock = threading.Lock()
        self._closed = False
        self.maps: PeerMaps[torch.Tensor] = PeerMaps(TorchIpc(), idle_close_s)
        # Transfers run on their own stream: the engine's default stream may hold a queued
        # step, and a hand-off copy must not wait behind it.
        self._stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self._stop = threading.Event()
        self._sweeper = threading.Thread(
            target=self._sweep_loop, args=(sweep_s,), name="cuda-ipc-sweep", daemon=True
        )
        self._sweeper.start()

    # -- the arena as device bytes ------------------------------------------------------------
    def view(self, addr: int, nbytes: int) -> DeviceView:  # type: ignore[override]
        off = self._offset(addr, nbytes)
        return DeviceView(self._dev_arena[off : off + nbytes])

    # -- sender side ----------------------------------------------------------------------------
    def write(self, src_addr: int, dest: KVDest, nbytes: int) -> float:
        """The blocking copy into the peer's slot, finished on the GPU when it returns."""
        if nbytes > dest.nbytes:
            raise TransferError(f"{nbytes} B do not fit the {dest.nbytes} B reserved")
        src = self._offset(src_addr, nbytes)
        t0 = time.perf_counter()
        lease = self.maps.acquire(dest.session, time.time())
        ok = False
        try:
            peer = lease.mapping
            off = dest.addr - lease.session.base
            if off < 0 or off + nbytes > peer.numel():
                raise TransferError(f"address {dest.addr:#x} outside the peer's arena")
            mine = self._dev_arena[src : src + nbytes]
            with torch.cuda.stream(self._stream):
                peer[off : off + nbytes].copy_(mine, non_blocking=True)
            self._stream.synchronize()
            ok = True
        finally:
            self.maps.release(lease, time.time(), failed=not ok)
        return time.perf_counter() - t0

    # -- receiver side, pulling (a migration's KV, read in the source's slot) -------------------
    @contextlib.contextmanager
    def peer_view(self, session: str, addr: int, nbytes: int) -> Iterator[DeviceView]:
        """``nbytes`` of a peer's GPU arena at ``addr``, mapped (opened on first use) for as long
        as the context is open: the engine copies them into its KV pages GPU to GPU. The peer
        wrote them and synchronised before it asked us to read."""
        lease = self.maps.acquire(session, time.time())
        peer = lease.mapping
        off = addr - lease.session.base
        if nbytes < 0 or off < 0 or off + nbytes > peer.numel():
            self.maps.release(lease, time.time())
            raise TransferError(f"address {addr:#x} outside the peer's arena")
        try:
            yield DeviceView(peer[off : off + nbytes])
        finally:
            # A failed load is the engine's (a header it refused), not the mapping's: a dead
            # peer is found by the next acquire's liveness check.
            self.maps.release(lease, time.time())

    # -- lifecycle ------------------------------------------------------------------------------
    def _sweep_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                for session in self.maps.sweep(time.time()):
                    log.info("cuda-ipc: mapping of %s closed (peer gone or idle)", session[:40])
            except Exception:  # the sweeper must outlive a bad round
                log.exception("cuda-ipc sweep failed")

    def close(self) -> None:
        """Closes every peer mapping (the arena itself goes with the process)."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
        self._stop.set()
        self.maps.close_all()

    def stats(self) -> dict[str, Any]:
        s = self.maps.stats
        return {"mapped": self.maps.mapped, "opened": s.opened, "closed": s.closed,
                "closed_dead": s.closed_dead, "closed_idle": s.closed_idle}  # fmt: skip
