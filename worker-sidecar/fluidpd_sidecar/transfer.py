"""KV hand-off transports: how a prefix's KV reaches the decode sidecar.

``SimTransfer`` takes the profile's modelled time (bytes / bandwidth + base latency) and moves
no bytes: the ``sim`` engine has none. ``MooncakeTransfer`` (``transfer_mooncake.py``) moves
real bytes between registered host buffers with mooncake-transfer-engine over TCP, as real
engines need (SGLang uses the same engine).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fluidpd_sidecar.engine import KVBytes

from fluidpd.core.predictors import TransferModel


@dataclass(frozen=True, slots=True)
class KVDest:
    """Where the receiving side wants the bytes (its engine's session and buffer address)."""

    session: str
    addr: int
    nbytes: int


class KVTransfer(Protocol):
    name: str
    #: Receiver-side room for incoming KV, in bytes (0: this transport moves no bytes). A
    #: reservation holds room from the decode side's admission until the engine has loaded it.
    arena_bytes: int

    def reserve(self, nbytes: int) -> KVDest | None:
        """Receiver side: set aside room for an incoming KV (None: no room now, or, with
        ``arena_bytes == 0``, this transport moves none)."""
        ...

    def free(self, dest: KVDest) -> None:
        """Receiver side: release a reservation."""
        ...

    async def send(self, src_addr: int | None, dest: KVDest | None, nbytes: int) -> float:
        """Sender side: move ``nbytes`` from ``src_addr`` to ``dest``; returns seconds taken."""
        ...


class PullTransfer(KVTransfer, Protocol):
    """A transport whose receiver can read a sender's staged bytes in place (``shm``: the
    sender's arena file, mapped; ``cuda-ipc``: the sender's GPU arena, through its IPC handle).

    A migration (drain ``migrate``) uses it: the target loads the KV straight from the source's
    staging slot, so it needs no arena room of its own (a 2K-context 8B request is ~270 MiB, and
    32 of them would not fit a target's arena at once) and the bytes cross once (``shm``: no
    host-to-host copy between the arenas)."""

    #: The sender's ``session`` for ``peer_view`` (its own arena).
    session: str

    def peer_view(self, session: str, addr: int, nbytes: int) -> AbstractContextManager[KVBytes]:
        """The ``nbytes`` at ``addr`` of the peer arena ``session``, readable here while the
        context is open (``TransferError`` if the peer cannot be reached)."""
        ...


def can_pull(transfer: KVTransfer) -> bool:
    return transfer.arena_bytes > 0 and callable(getattr(transfer, "peer_view", None))


class SimTransfer:
    name = "sim"
    arena_bytes = 0

    def __init__(self, model: TransferModel) -> None:
        self.model = model

    def reserve(self, nbytes: int) -> KVDest | None:
        return None

    def free(self, dest: KVDest) -> None:
        return None

    async def send(self, src_addr: int | None, dest: KVDest | None, nbytes: int) -> float:
        seconds = self.model.time(nbytes)
        await asyncio.sleep(seconds)
        return seconds
