"""``MooncakeTransfer``: real bytes between real processes over Mooncake's TCP transport.

Each peer is a spawned OS process with its own ``MooncakeTransfer`` (own engine, own port, own
arena) on 127.0.0.1, driven over a pipe: the test plays the sidecars' control channel (D tells
P where to write, P tells D it is done). Every wait on a peer is bounded, so a broken transport
fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from fluidpd_sidecar.transfer_mooncake import (
    FirstFitAllocator,
    MooncakeTransfer,
    TransferError,
)

try:
    import mooncake.engine  # noqa: F401

    MOONCAKE_ERROR = ""
except ImportError as exc:  # the wheel, or libibverbs1/libnuma1, is missing
    MOONCAKE_ERROR = str(exc)

needs_mooncake = pytest.mark.skipif(
    bool(MOONCAKE_ERROR),
    reason=(
        "mooncake transfer engine not importable "
        "(pip install mooncake-transfer-engine-non-cuda==0.3.13.post1; "
        f"apt-get install -y libibverbs1 libnuma1): {MOONCAKE_ERROR}"
    ),
)

MiB = 1 << 20
WAIT_S = 60.0  # generous bound on any single peer round trip (64 MiB of pattern + hashing)

DestT = tuple[str, int, int]  # KVDest as a plain tuple: crosses the pipe without pickling classes


def pattern(seed: int, nbytes: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the peer process --------------------------------------------------------------------


async def _send_all(tr: Any, jobs: list[tuple[DestT, int, int]]) -> dict[str, Any]:
    """Stage each job's pattern in a source buffer and send all of them concurrently."""
    from fluidpd_sidecar.transfer import KVDest  # noqa: PLC0415

    staged = []
    for (session, addr, dnbytes), seed, nbytes in jobs:
        src = tr.source_buffer(max(nbytes, 1))
        assert src is not None, "sender arena full"
        tr.view(src.addr, nbytes)[:] = pattern(seed, nbytes)
        staged.append((src, KVDest(session, addr, dnbytes), nbytes))

    # A ticker on the same loop: if the blocking write ran on the loop, it would not tick.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    start = ticks
    results = await asyncio.gather(
        *(tr.send(src.addr, dest, n) for src, dest, n in staged), return_exceptions=True
    )
    during = ticks - start
    ticker.cancel()
    out = []
    for (src, _, n), res in zip(staged, results, strict=True):
        if isinstance(res, BaseException):
            out.append(("err", type(res).__name__, str(res)))
        else:
            out.append(("ok", digest(tr.view(src.addr, n)), res))
        tr.release_source(src)
    return {"results": out, "ticks": during}


def _peer_main(conn: Connection, arena_bytes: int, env: dict[str, str]) -> None:
    os.environ.update(env)  # Mooncake reads its MC_* settings when the engine starts
    from fluidpd_sidecar.transfer import KVDest  # noqa: PLC0415
    from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer  # noqa: PLC0415

    try:
        tr = MooncakeTransfer("127.0.0.1", arena_bytes)
    except Exception as exc:
        conn.send(("err", type(exc).__name__, str(exc)))
        return
    conn.send(("ok", tr.session))
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "reserve":
                dest = tr.reserve(args[0])
                value: Any = None if dest is None else (dest.session, dest.addr, dest.nbytes)
            elif cmd == "free":
                tr.free(KVDest(*args[0]))
                value = None
            elif cmd == "digest":
                value = digest(tr.view(*args))
            elif cmd == "send":
                value = asyncio.run(_send_all(tr, args[0]))
            elif cmd == "close":
                tr.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {cmd}")
        except Exception as exc:
            conn.send(("err", type(exc).__name__, str(exc)))
        else:
            conn.send(("ok", value))


# -- the test side -------------------------------------------------------------------------


class Peer:
    def __init__(self, arena_bytes: int, env: dict[str, str] | None = None) -> None:
        ctx = mp.get_context("spawn")  # no fork: the parent may hold engine threads
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(child, arena_bytes, env or {}))
        self.proc.start()
        child.close()
        self.session: str = self._reply(WAIT_S)

    def _reply(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise AssertionError(f"peer {self.proc.pid} gave no answer within {timeout}s")
        status, *rest = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"peer error {rest[0]}: {rest[1]}")
        return rest[0]

    def call(self, cmd: str, *args: Any, timeout: float = WAIT_S) -> Any:
        self.conn.send((cmd, *args))
        return self._reply(timeout)

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(AssertionError, RuntimeError, OSError, EOFError):
                self.call("close", timeout=15)
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


@pytest.fixture
def peers() -> Iterator[tuple[Peer, Peer]]:
    started: list[Peer] = []
    try:
        started.append(Peer(160 * MiB))  # receiver (decode side)
        started.append(Peer(160 * MiB))  # sender (prefill side)
        yield started[0], started[1]
    finally:
        for p in started:
            p.stop()


# -- tests ---------------------------------------------------------------------------------


@needs_mooncake
@pytest.mark.parametrize("nbytes", [1, 3 * MiB + 7, 64 * MiB], ids=["1B", "3MiB+7", "64MiB"])
def test_bytes_arrive_intact(peers: tuple[Peer, Peer], nbytes: int) -> None:
    recv, send = peers
    dest = recv.call("reserve", nbytes)
    after = recv.call("reserve", 4096)  # first fit: the very next block of the arena
    assert dest[0] == recv.session and dest[2] == nbytes
    out = send.call("send", [(dest, 1234, nbytes)])
    [(status, src_digest, seconds)] = out["results"]
    assert status == "ok", out
    assert seconds > 0
    assert src_digest == digest(pattern(1234, nbytes))
    # The sender said "done": the bytes must now be in the receiver's reservation...
    assert recv.call("digest", dest[1], nbytes) == src_digest
    # ...and nowhere else (the neighbouring reservation is still all zeros).
    assert recv.call("digest", after[1], 4096) == digest(bytes(4096))
    if nbytes == 64 * MiB:
        # The write ran off the event loop: the sender's loop kept ticking meanwhile.
        assert out["ticks"] >= 2, out


@needs_mooncake
def test_concurrent_sends_to_different_slots(peers: tuple[Peer, Peer]) -> None:
    recv, send = peers
    sizes = [MiB + 1, 5 * MiB, 7, 2 * MiB + 4095, 8 * MiB, 4096, 3 * MiB + 3, 16 * MiB]
    dests = [recv.call("reserve", n) for n in sizes]
    assert all(d is not None for d in dests)
    jobs = [(d, 100 + i, n) for i, (d, n) in enumerate(zip(dests, sizes, strict=True))]
    out = send.call("send", jobs)
    for (dest, seed, n), (status, src_digest, _) in zip(jobs, out["results"], strict=True):
        assert status == "ok", out
        assert src_digest == digest(pattern(seed, n))
        assert recv.call("digest", dest[1], n) == src_digest
    for d in dests:
        recv.call("free", d)
    # Everything freed: the whole arena is one block again.
    assert recv.call("reserve", 160 * MiB) is not None


@needs_mooncake
def test_bogus_destinations_fail_cleanly(peers: tuple[Peer, Peer]) -> None:
    recv, send = peers
    good = recv.call("reserve", MiB)
    bad = [
        ("127.0.0.1:1", good[1], MiB),  # nobody listens there
        ("no-such-host.invalid:12345", good[1], MiB),  # does not resolve
        (recv.session, 0x1000, MiB),  # a live peer, an address it never registered
        (recv.session, good[1] + 160 * MiB, MiB),  # just past the peer's arena
    ]
    start = time.monotonic()
    out = send.call("send", [(d, 7, MiB) for d in bad])
    for d, res in zip(bad, out["results"], strict=True):
        assert res[0] == "err" and res[1] == "TransferError", (d, res)
    assert time.monotonic() - start < 30
    # The engine is still usable after failures.
    ok = send.call("send", [(good, 8, MiB)])["results"][0]
    assert ok[0] == "ok" and recv.call("digest", good[1], MiB) == ok[1]


@needs_mooncake
def test_dead_receiver_fails_with_transfer_error(peers: tuple[Peer, Peer]) -> None:
    recv, send = peers
    dest = recv.call("reserve", 4 * MiB)
    assert send.call("send", [(dest, 1, 4 * MiB)])["results"][0][0] == "ok"  # connected
    recv.proc.kill()
    recv.proc.join(10)
    res = send.call("send", [(dest, 2, 4 * MiB)])["results"][0]
    assert res[:2] == ("err", "TransferError"), res


@needs_mooncake
def test_stalled_receiver_times_out() -> None:
    # A receiver that stops reading (SIGSTOP) must not hang the sender: Mooncake drops a
    # connection without progress after MC_TCP_PROGRESS_TIMEOUT_SEC (30 s by default; 2 here).
    recv = Peer(128 * MiB)
    send = Peer(128 * MiB, {"MC_TCP_PROGRESS_TIMEOUT_SEC": "2"})
    try:
        dest = recv.call("reserve", 128 * MiB)
        assert send.call("send", [(dest, 1, MiB)])["results"][0][0] == "ok"
        assert recv.proc.pid is not None
        os.kill(recv.proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        res = send.call("send", [(dest, 2, 128 * MiB)], timeout=40)["results"][0]
        assert res[:2] == ("err", "TransferError"), res
        assert time.monotonic() - start < 20
    finally:
        recv.proc.kill()  # SIGKILL also ends a stopped process
        recv.proc.join(10)
        recv.stop()
        send.stop()


@needs_mooncake
def test_reserve_none_when_full_and_again_after_free() -> None:
    with MooncakeTransfer("127.0.0.1", MiB) as tr:
        assert tr.arena_bytes == MiB and tr.base % 4096 == 0
        quarters = [tr.reserve(MiB // 4) for _ in range(4)]
        assert all(q is not None for q in quarters)
        assert tr.reserve(1) is None
        assert tr.source_buffer(1) is None  # staging shares the arena
        q1 = quarters[1]
        assert q1 is not None
        tr.free(q1)
        again = tr.reserve(MiB // 4)
        assert again is not None and again.addr == q1.addr  # first fit reuses the hole
        assert tr.reserve(1) is None
        for q in [again, quarters[0], quarters[2], quarters[3]]:
            assert q is not None
            tr.free(q)
        whole = tr.reserve(MiB)
        assert whole is not None and whole.addr == tr.base
        with pytest.raises(ValueError):
            tr.free(type(whole)("127.0.0.1:1", whole.addr, whole.nbytes))  # not ours


@needs_mooncake
def test_send_checks_its_arguments() -> None:
    with MooncakeTransfer("127.0.0.1", MiB) as tr:
        src = tr.source_buffer(4096)
        dest = tr.reserve(4096)
        assert src is not None and dest is not None
        with pytest.raises(ValueError, match="outside this arena"):
            asyncio.run(tr.send(tr.base + 2 * MiB, dest, 4096))  # would read stray memory
        with pytest.raises(ValueError, match="does not fit"):
            asyncio.run(tr.send(src.addr, dest, 8192))
        with pytest.raises(ValueError, match="real bytes"):
            asyncio.run(tr.send(None, dest, 4096))
        with pytest.raises(ValueError, match="outside this arena"):
            tr.view(tr.base + MiB - 1, 2)
        # Loopback to itself works too (one engine is both ends).
        tr.view(src.addr, 4096)[:] = pattern(3, 4096)
        assert asyncio.run(tr.send(src.addr, dest, 4096)) > 0
        assert bytes(tr.view(dest.addr, 4096)) == pattern(3, 4096)
    with pytest.raises(TransferError, match="closed"):
        tr.reserve(1)
    with pytest.raises(TransferError, match="closed"):
        asyncio.run(tr.send(src.addr, dest, 4096))


def test_sidecar_imports_without_mooncake() -> None:
    # A fresh interpreter where importing mooncake fails, as on a host without the wheel.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["mooncake"] = None
        sys.modules["mooncake.engine"] = None
        import fluidpd_sidecar.transfer, fluidpd_sidecar.engine
        from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer, MooncakeUnavailableError
        try:
            MooncakeTransfer()
        except MooncakeUnavailableError as exc:
            print(exc)
        else:
            raise SystemExit("built without mooncake")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install mooncake-transfer-engine-non-cuda" in proc.stdout
    assert "libibverbs1" in proc.stdout


def test_first_fit_allocator() -> None:
    a = FirstFitAllocator(10 * 4096, align=4096)
    x = a.alloc(1)  # rounds up to one page
    y = a.alloc(4097)  # two pages
    z = a.alloc(3 * 4096)
    assert (x, y, z) == (0, 4096, 3 * 4096)
    assert y is not None
    assert a.block_size(y) == 2 * 4096 and a.free_bytes == 4 * 4096
    assert a.alloc(5 * 4096) is None
    a.free(y)
    assert a.alloc(3 * 4096) == 6 * 4096  # the 2-page hole is too small: first fit skips it
    assert a.alloc(2 * 4096) == 4096  # ...and fills it when it fits
    with pytest.raises(ValueError):
        a.free(12345)
    for off in (0, 4096, 3 * 4096, 6 * 4096):
        a.free(off)
    assert a.free_bytes == a.largest_free == 10 * 4096  # coalesced back to one block
    with pytest.raises(ValueError):
        a.alloc(0)
