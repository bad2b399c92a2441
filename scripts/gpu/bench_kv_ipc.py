"""KV hand-off bandwidth on one host: CUDA IPC (GPU to GPU between two processes) against
today's ``shm`` path (GPU -> pinned shared-memory arena -> peer's arena -> GPU).

Two processes, as two sidecars are: the receiver allocates its device arena once and exports
one CUDA IPC handle for it (torch.multiprocessing sends the tensor as a handle); the sender
maps it once and copies into it with ``copy_`` (a device-to-device DMA, no host staging). A
receiver's arena is one allocation for its whole life, so there is no per-transfer handle to
leak; the sender drops its mapping when done, and when the receiver process dies first (it is
SIGKILLed at the end here) the driver frees its memory once the sender has closed its mapping.

Prints one line per size and writes JSON: ``python scripts/gpu/bench_kv_ipc.py --out X.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import mmap
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

MIB = 1 << 20


def _receiver(device: str, nbytes: int, q: Any, done: Any) -> None:
    arena = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    q.put(arena)  # sent as a CUDA IPC handle
    done.wait()
    # The check that the bytes arrived is the sender's: it reads them back through the handle.


def cuda_timed(fn: Any, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, the device synchronised around each
    (kv_ipc_live.py times its copies with it too)."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _stats(nbytes: int, times: list[float]) -> dict[str, float]:
    times = sorted(times)
    med = times[len(times) // 2]
    return {"median_s": med, "min_s": times[0], "gb_per_s": nbytes / med / 1e9}


def bench_ipc(sizes: list[int], device: str, peer: str, repeats: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    top = max(sizes)
    proc = ctx.Process(target=_receiver, args=(peer, top, q, done), daemon=True)
    proc.start()
    remote = q.get(timeout=120)  # the peer's arena, mapped here through its IPC handle
    src = torch.randint(0, 255, (top,), dtype=torch.uint8, device=device)
    rows = {}
    for n in sizes:
        times = cuda_timed(lambda n=n: remote[:n].copy_(src[:n], non_blocking=True), repeats)
        ok = bool(torch.equal(remote[:n].to(device), src[:n]))
        rows[n] = {**_stats(n, times), "bytes_equal": ok}
    remote = None  # closes the mapping (cudaIpcCloseMemHandle) before the receiver ends
    torch.cuda.synchronize()
    done.set()
    proc.join(10)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    return rows


def bench_shm(sizes: list[int], device: str, repeats: int) -> dict[str, Any]:
    """The shm transport's data path in one process: D2H into a pinned /dev/shm arena, one
    memcpy into the peer's arena (another /dev/shm file), H2D on the receiving side."""
    top = max(sizes)
    files, maps = [], []
    for tag in ("src", "dst"):
        path = Path(f"/dev/shm/fluidpd-bench-{os.getpid()}-{tag}")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, top)
        maps.append(mmap.mmap(fd, top, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)))
        os.close(fd)
        files.append(path)
    a, b = (np.frombuffer(m, dtype=np.uint8) for m in maps)
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    for arr in (a, b):
        cudart.cudaHostRegister(arr.ctypes.data, top, 0)
    ha, hb = torch.from_numpy(a), torch.from_numpy(b)
    src = torch.randint(0, 255, (top,), dtype=torch.uint8, device=device)
    dst = torch.empty(top, dtype=torch.uint8, device=device)
    rows = {}
    for n in sizes:
        d2h = cuda_timed(lambda n=n: ha[:n].copy_(src[:n]), repeats)
        h2h = cuda_timed(lambda n=n: np.copyto(b[:n], a[:n]), repeats)
        h2d = cuda_timed(lambda n=n: dst[:n].copy_(hb[:n]), repeats)
        total = [x + y + z for x, y, z in zip(d2h, h2h, h2d, strict=True)]
        same = bool(torch.equal(dst[:n], src[:n]))
        rows[n] = {**_stats(n, total), "d2h": _stats(n, d2h), "host_copy": _stats(n, h2h),
                   "h2d": _stats(n, h2d), "bytes_equal": same}  # fmt: skip
    for arr in (a, b):
        cudart.cudaHostUnregister(arr.ctypes.data)
    # The buffers (and the loop variable) export the maps: release them before closing.
    ha = hb = a = b = arr = None
    gc.collect()
    for m in maps:
        # A view still alive somewhere: the map goes with the process.
        with contextlib.suppress(BufferError):
            m.close()
    for path in files:
        path.unlink()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,64,512", help="comma-separated sizes, MiB")
    ap.add_argument("--device", default="cuda:0", help="sender's GPU")
    ap.add_argument("--peer-device", default="cuda:0", help="receiver's GPU (same or another)")
    ap.add_argument("--repeats", type=int, default=20, help="timed copies per size")
    ap.add_argument("--out", required=True, help="JSON result file")
    args = ap.parse_args()
    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    ipc = bench_ipc(sizes, args.device, args.peer_device, args.repeats)
    shm = bench_shm(sizes, args.device, args.repeats)
    for n in sizes:
        i, s = ipc[n], shm[n]
        print(f"{n // MIB:5d} MiB  cuda-ipc {i['gb_per_s']:8.1f} GB/s {i['median_s'] * 1e3:8.3f} ms"
              f"   shm {s['gb_per_s']:7.2f} GB/s {s['median_s'] * 1e3:9.3f} ms")  # fmt: skip
    result = {
        "command": "python scripts/gpu/bench_kv_ipc.py " + " ".join(os.sys.argv[1:]),
        "device": torch.cuda.get_device_name(args.device),
        "peer_device": args.peer_device,
        "cuda_ipc": {str(n // MIB): v for n, v in ipc.items()},
        "shm": {str(n // MIB): v for n, v in shm.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
