"""Throughput of the KV hand-off (``MooncakeTransfer``, TCP) between two processes.

The receiver (decode side) is a spawned process that reserves one region of its arena and
reports (session, address); this process is the sender (prefill side): it stages a random
pattern in its own arena and writes it with ``MooncakeTransfer.send``, timing each send as the
caller sees it (thread hand-off included). After each size the receiver hashes what arrived, so
a number is only reported for bytes that really moved.

    python scripts/bench_kv_transfer.py [--sizes-mib 1,2,...,256] [--repeats 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from fluidpd_sidecar.transfer import KVDest
from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer

MiB = 1 << 20
DEFAULT_OUT = "results/kv-transfer/mooncake-tcp-loopback.json"
WAIT_S = 120.0


def _receiver(conn: Connection, hostname: str, nbytes: int) -> None:
    with MooncakeTransfer(hostname, nbytes) as tr:
        dest = tr.reserve(nbytes)
        assert dest is not None
        conn.send((dest.session, dest.addr, dest.nbytes))
        while True:
            cmd, *args = conn.recv()
            if cmd == "close":
                break
            addr, n = args
            conn.send(hashlib.sha256(tr.view(addr, n)).hexdigest())
    conn.send("closed")


def _answer(conn: Connection) -> Any:
    # Bounded: a dead or stuck receiver ends the benchmark with an error, not a hang.
    if not conn.poll(WAIT_S):
        raise TimeoutError(f"receiver gave no answer within {WAIT_S}s")
    return conn.recv()


async def _timed_send(
    tr: MooncakeTransfer, src: int, dest: KVDest, size: int, streams: int
) -> float:
    """One hand-off of ``size`` bytes, split into ``streams`` concurrent writes; wall seconds."""
    step = -(-size // streams)
    parts = [(o, min(step, size - o)) for o in range(0, size, step)]
    start = time.perf_counter()
    await asyncio.gather(
        *(tr.send(src + o, KVDest(dest.session, dest.addr + o, n), n) for o, n in parts)
    )
    return time.perf_counter() - start


async def _bench(args: argparse.Namespace, sizes: list[int]) -> list[dict[str, Any]]:
    biggest = max(sizes)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(child, args.hostname, biggest))
    proc.start()
    child.close()
    rows: list[dict[str, Any]] = []
    try:
        dest = KVDest(*_answer(conn))
        with MooncakeTransfer(args.hostname, biggest) as tr:
            src = tr.source_buffer(biggest)
            assert src is not None
            rng = np.random.default_rng(0)
            for size in sizes:
                # A fresh pattern per size, so the check below fails unless this size's
                # writes landed (smaller sizes before it left the tail untouched).
                buf = np.frombuffer(tr.view(src.addr, size), dtype=np.uint8)
                buf[:] = rng.integers(0, 256, size=size, dtype=np.uint8)
                for _ in range(args.warmup):
                    await _timed_send(tr, src.addr, dest, size, args.streams)
                samples = [
                    await _timed_send(tr, src.addr, dest, size, args.streams)
                    for _ in range(args.repeats)
                ]
                conn.send(("digest", dest.addr, size))
                ok = _answer(conn) == hashlib.sha256(tr.view(src.addr, size)).hexdigest()
                if not ok:
                    raise RuntimeError(f"{size} B: receiver's bytes differ from the sender's")
                median = statistics.median(samples)
                rows.append(
                    {
                        "bytes": size,
                        "mib": size / MiB,
                        "median_ms": median * 1e3,
                        "min_ms": min(samples) * 1e3,
                        "max_ms": max(samples) * 1e3,
                        "gb_per_s": size / median / 1e9,
                        "samples_s": samples,
                        "verified": ok,
                    }
                )
                r = rows[-1]
                print(
                    f"{r['mib']:>8.0f} {r['median_ms']:>10.2f} {r['min_ms']:>9.2f} "
                    f"{r['gb_per_s']:>7.2f}",
                    flush=True,
                )
        conn.send(("close",))
        _answer(conn)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    return rows


def _mooncake_version() -> str:
    for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mib", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed sends per size first")
    ap.add_argument("--streams", type=int, default=1, help="concurrent writes per hand-off")
    ap.add_argument("--hostname", default="127.0.0.1")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    sizes = [int(float(s) * MiB) for s in args.sizes_mib.split(",")]

    print(f"{'MiB':>8} {'median ms':>10} {'min ms':>9} {'GB/s':>7}", flush=True)
    rows = asyncio.run(_bench(args, sizes))
    result = {
        "command": shlex.join(sys.orig_argv),
        "cwd": os.getcwd(),
        "transport": "mooncake-transfer-engine, protocol tcp, metadata P2PHANDSHAKE",
        "mooncake_version": _mooncake_version(),
        "hostname": args.hostname,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "streams": args.streams,
        "timing": "wall time of MooncakeTransfer.send (asyncio.to_thread + transfer_sync_write)",
        "gb": "1e9 bytes",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "results": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
