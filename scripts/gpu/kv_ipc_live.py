"""The sidecar's ``cuda-ipc`` KV transport against ``shm``, two processes on one GPU, through
the transport classes the sidecars run (``CudaIpcTransfer``, ``ShmTransfer``), not a copy.

``bench``: a receiver process reserves a slot in its arena and hands the ``KVDest`` over, as a
decode sidecar's reservation does; this process stages random bytes in its own arena's source
slot and times ``write`` (the blocking copy) and ``send`` (what the sidecar awaits: the copy on
a worker thread) at each size, median of ``--repeats``, then asks the receiver for a checksum
of what arrived. Beside the copy it times the engine's ends of the path: staging the KV from
GPU memory into the source slot (cuda-ipc: device to device; shm: D2H into the pinned arena)
and loading it from the received slot into GPU memory (cuda-ipc: D2D; shm: H2D).

``leak``: the receiver (a 2 GiB arena) is SIGKILLed while this process maps it; the device's
free memory is read before, with both alive, right after the kill and after the transport's
background sweeper (every 2 s) closed the mapping: a dead peer's arena must come back.

Prints progress and writes JSON after each part: ``python kv_ipc_live.py bench --out X.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kv_ipc import cuda_timed

from fluidpd_sidecar.gpu.runner import pin_host_memory
from fluidpd_sidecar.transfer import KVDest
from fluidpd_sidecar.transfer_cuda_ipc import CudaIpcTransfer
from fluidpd_sidecar.transfer_shm import ShmTransfer

MIB = 1 << 20


def _make(kind: str, nbytes: int, device: str) -> CudaIpcTransfer | ShmTransfer:
    if kind == "cuda-ipc":
        return CudaIpcTransfer(nbytes, device=device, sweep_s=0.5)
    t = ShmTransfer(nbytes)
    if not pin_host_memory(t.base, t.arena_bytes):  # as the gpu engine pins it
        print("warning: cudaHostRegister failed", flush=True)
    return t


def _bytes_of(t: CudaIpcTransfer | ShmTransfer, addr: int, n: int) -> torch.Tensor:
    view = t.view(addr, n)
    if isinstance(t, CudaIpcTransfer):
        return view.tensor  # type: ignore[union-attr]
    return torch.frombuffer(view, dtype=torch.uint8, count=n)


def _checksum(data: torch.Tensor) -> int:
    return int(data.view(torch.int64).sum().item())


def _receiver(kind: str, arena: int, slot: int, device: str, conn: Any) -> None:
    t = _make(kind, arena, device)
    dest = t.reserve(slot)
    assert dest is not None
    conn.send((dest.session, dest.addr, dest.nbytes))
    sink = torch.empty(slot, dtype=torch.uint8, device=device)
    while True:
        cmd, n, repeats = conn.recv()
        if cmd == "stop":
            break
        data = _bytes_of(t, dest.addr, n)
        if cmd == "check":
            conn.send(_checksum(data))
        elif cmd == "load":  # the engine's end: received slot -> GPU memory
            conn.send(cuda_timed(lambda data=data, n=n: sink[:n].copy_(data), repeats))
    t.close()


def _stats(nbytes: int, times: list[float]) -> dict[str, float]:
    med = statistics.median(times)
    return {"median_ms": round(med * 1e3, 4), "min_ms": round(min(times) * 1e3, 4),
            "gb_per_s": round(nbytes / med / 1e9, 2)}  # fmt: skip


def bench(kind: str, sizes: list[int], device: str, repeats: int) -> dict[str, Any]:
    top = max(sizes)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(kind, top + MIB, top, device, child), daemon=True)
    proc.start()
    if not conn.poll(180):
        raise RuntimeError(f"{kind} receiver did not start")
    session, addr, nbytes = conn.recv()
    dest = KVDest(session, addr, nbytes)
    t = _make(kind, top + MIB, device)
    region = t.source_buffer(top)
    assert region is not None
    slot = _bytes_of(t, region.addr, top)
    kv = torch.randint(0, 256, (top,), dtype=torch.uint8, device=device)
    rows: dict[str, Any] = {}
    t0 = time.perf_counter()
    first = t.write(region.addr, dest, MIB)  # the first copy opens the peer's handle (cuda-ipc)
    rows["first_write_ms"] = round(first * 1e3, 3)
    rows["first_call_wall_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    for n in sizes:
        stage = cuda_timed(lambda n=n: slot[:n].copy_(kv[:n]), repeats)
        writes = [t.write(region.addr, dest, n) for _ in range(repeats)]

        async def sends(n: int = n) -> list[float]:
            out = []
            for _ in range(repeats):
                s0 = time.perf_counter()
                await t.send(region.addr, dest, n)
                out.append(time.perf_counter() - s0)
            return out

        sent = asyncio.run(sends())
        conn.send(("check", n, 0))
        same = conn.recv() == _checksum(kv[:n])
        conn.send(("load", n, repeats))
        load = conn.recv()
        path = [a + b + c for a, b, c in zip(stage, writes, load, strict=True)]
        rows[str(n // MIB)] = {
            "write": _stats(n, writes),
            "send": _stats(n, sent),
            "stage": _stats(n, stage),
            "load": _stats(n, load),
            "gpu_to_gpu": _stats(n, path),
            "bytes_equal": same,
        }
        r = rows[str(n // MIB)]
        print(f"{kind:8s} {n // MIB:4d} MiB  write {r['write']['gb_per_s']:8.1f} GB/s "
              f"{r['write']['median_ms']:8.3f} ms  send {r['send']['median_ms']:8.3f} ms  "
              f"GPU->GPU {r['gpu_to_gpu']['gb_per_s']:7.1f} GB/s  equal {same}",
              flush=True)  # fmt: skip
    conn.send(("stop", 0, 0))
    proc.join(20)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    t.close()
    if isinstance(t, CudaIpcTransfer):
        rows["maps"] = t.stats()
    return rows


def leak(device: str, arena_mib: int) -> dict[str, Any]:
    """A receiver SIGKILLed while mapped here: does its arena come back, and when?"""

    def free_mib() -> float:
        torch.cuda.synchronize()
        return round(torch.cuda.mem_get_info(torch.device(device))[0] / MIB, 1)

    # The background sweeper looks every 2 s: the reading right after the kill (0.2 s) comes
    # before it, most likely (``mapped_at_kill_reading`` says whether it did).
    t = CudaIpcTransfer(64 * MIB, device=device, sweep_s=2.0)
    free0 = free_mib()
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(
        target=_receiver, args=("cuda-ipc", arena_mib * MIB, MIB, device, child), daemon=True
    )
    proc.start()
    if not conn.poll(180):
        raise RuntimeError("leak receiver did not start")
    dest = KVDest(*conn.recv())
    region = t.source_buffer(MIB)
    assert region is not None
    t.write(region.addr, dest, MIB)
    free1 = free_mib()
    mapped_before = t.maps.mapped
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    time.sleep(0.2)
    free2 = free_mib()
    mapped_at_kill_reading = t.maps.mapped
    t0 = time.time()
    while t.maps.mapped and time.time() - t0 < 10:
        time.sleep(0.05)
    swept_s = round(time.time() - t0, 3)
    time.sleep(0.5)
    free3 = free_mib()
    error = ""
    try:
        t.write(region.addr, dest, MIB)
    except Exception as exc:  # what a send to the dead peer gets
        error = f"{type(exc).__name__}: {exc}"
    out = {
        "arena_mib": arena_mib,
        "free_mib": {
            "before_peer": free0,
            "peer_alive_mapped": free1,
            "peer_killed_still_mapped": free2,
            "after_sweep": free3,
        },
        "held_after_kill_mib": round(free3 - free2, 1),
        "mapped_before_kill": mapped_before,
        "mapped_at_kill_reading": mapped_at_kill_reading,
        "mapped_after_sweep": t.maps.mapped,
        "sweep_closed_after_s": swept_s,
        "closed_dead": t.maps.stats.closed_dead,
        "write_to_dead_peer": error,
    }
    t.close()
    print(f"leak: free MiB {free0} -> {free1} (peer alive, mapped) -> {free2} (peer killed) -> "
          f"{free3} (after sweep, {swept_s} s); a send to it: {error}", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["bench"])
    ap.add_argument("--sizes-mib", default="1,64,512")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--leak-arena-mib", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    out: dict[str, Any] = {
        "command": "python scripts/gpu/kv_ipc_live.py " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name(args.device),
        "torch": torch.__version__,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, part in (
        ("cuda_ipc", lambda: bench("cuda-ipc", sizes, args.device, args.repeats)),
        ("shm", lambda: bench("shm", sizes, args.device, args.repeats)),
        ("leak", lambda: leak(args.device, args.leak_arena_mib)),
    ):
        try:
            out[name] = part()
        except Exception as exc:  # keep the other parts: this run costs shared device time
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name} failed: {exc!r}", flush=True)
        path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
