"""Split-prefill equivalence across two processes (FluidToken's correctness on real compute).

The parent (the "decode worker") reserves room in its transport's arena (``shm`` or
``mooncake``) and starts a child (the "prefill worker") with the same model and weights.
For each beta the child prefills the prefix p = round((1 - beta) L), writes the KV in the
wire format into its own pinned arena and sends it to the parent's reservation. The parent
computes the unsplit prefill of the whole prompt itself, then for each beta loads the
received KV, runs the suffix as an extend pass, and compares the last position's logits
with the unsplit ones: max absolute error, max error relative to the largest logit, and
the greedy token.

``python -m fluidpd_sidecar.gpu.equivalence --shape tiny-llama --device cpu`` prints the
report as JSON; the CI test and ``scripts/gpu/bench.py`` call ``split_check``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import torch

from fluidpd_sidecar.gpu import wire
from fluidpd_sidecar.gpu.config import resolve_shape
from fluidpd_sidecar.gpu.profiler import bench_ids
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions, pin_host_memory
from fluidpd_sidecar.transfer import KVDest
from fluidpd_sidecar.transfer_mooncake import MooncakeTransfer
from fluidpd_sidecar.transfer_shm import ShmTransfer

BETAS = (0.1, 0.25, 0.5, 0.9)
RID = 7


def make_transport(kind: str, arena_bytes: int) -> ShmTransfer | MooncakeTransfer:
    """``shm`` (same host) or ``mooncake`` (TCP, loopback here)."""
    if kind == "mooncake":
        return MooncakeTransfer(hostname="127.0.0.1", arena_bytes=arena_bytes)
    return ShmTransfer(arena_bytes)


def pin(transfer: ShmTransfer | MooncakeTransfer, device: str) -> None:
    if device.startswith("cuda"):
        pin_host_memory(transfer.base, transfer.arena_bytes)


def _options(spec: dict[str, Any]) -> RunnerOptions:
    return RunnerOptions(
        device=spec["device"],
        dtype=spec["dtype"],
        seed=spec["seed"],
        kv_tokens=2 * spec["prompt_len"] + 64,
        max_context=spec["prompt_len"] + 16,
        max_batch=1,
        cuda_graphs=False,
    )


def _prefix_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Child: prefix prefill, stage, send; returns timings."""
    cfg = resolve_shape(spec["shape"])
    runner = ModelRunner(cfg, _options(spec))
    ids = bench_ids(spec["prompt_len"], cfg.vocab, RID)
    esize = runner.weights.embed.element_size()
    arena = sum(wire.wire_bytes(cfg, p, esize) + 4096 for p in spec["prefixes"])
    transfer = make_transport(spec["transport"], arena)
    pin(transfer, spec["device"])
    report = []
    for p, dest in zip(spec["prefixes"], spec["dests"], strict=True):
        t0 = time.perf_counter()
        runner.prefill(RID, ids[:p])
        runner.sync()
        t1 = time.perf_counter()
        n = wire.wire_bytes(cfg, p, esize)
        region = transfer.source_buffer(n)
        assert region is not None
        wire.write(transfer.view(region.addr, n), RID, -1, runner.export(RID, p))
        runner.sync()
        t2 = time.perf_counter()
        t3 = time.perf_counter()
        asyncio.run(transfer.send(region.addr, KVDest(*dest), n))
        copy_s = time.perf_counter() - t3
        report.append(
            {"prefix": p, "bytes": n, "prefill_s": t1 - t0, "stage_s": t2 - t1, "send_s": copy_s}
        )
        transfer.release_source(region)
        runner.release(RID)
    transfer.close()
    return {"prefixes": report}


def split_check(
    shape: str,
    device: str = "cpu",
    dtype: str = "float32",
    prompt_len: int = 64,
    betas: tuple[float, ...] = BETAS,
    seed: int = 0,
    transport: str = "shm",
) -> dict[str, Any]:
    cfg = resolve_shape(shape)
    spec: dict[str, Any] = {
        "shape": shape, "device": device, "dtype": dtype, "seed": seed, "prompt_len": prompt_len,
        "transport": transport,
    }  # fmt: skip
    prefixes = [round((1 - b) * prompt_len) for b in betas]
    esize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    sizes = [wire.wire_bytes(cfg, p, esize) for p in prefixes]
    transfer = make_transport(transport, sum(s + 4096 for s in sizes))
    dests = [transfer.reserve(s) for s in sizes]
    spec["prefixes"] = prefixes
    spec["dests"] = [[d.session, d.addr, d.nbytes] for d in dests if d is not None]
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "fluidpd_sidecar.gpu.equivalence",
            "--prefix-worker",
            json.dumps(spec),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"prefix worker failed: {child.stderr.strip()[-2000:]}")
    sent = json.loads(child.stdout.strip().splitlines()[-1])["prefixes"]
    pin(transfer, device)
    runner = ModelRunner(cfg, _options(spec))
    ids = bench_ids(prompt_len, cfg.vocab, RID)
    with torch.inference_mode():
        full = runner.prefill(1, ids)
        runner.release(1)
        scale = float(full.abs().max())
        rows = []
        for beta, p, dest, s in zip(betas, prefixes, dests, sent, strict=True):
            assert dest is not None
            view = transfer.view(dest.addr, dest.nbytes)
            head = wire.read_header(view)
            t0 = time.perf_counter()
            runner.load(2, wire.payload(view, head, runner.dtype))
            runner.sync()
            load_s = time.perf_counter() - t0
            split = runner.prefill(2, ids[p:], start=p)
            runner.release(2)
            err = float((split - full).abs().max())
            rows.append(
                {
                    "beta": beta,
                    "prefix": p,
                    "suffix": prompt_len - p,
                    "stamp_ok": head.rid == RID and head.tokens == p,
                    "max_abs_err": err,
                    "max_rel_err": err / scale,
                    "greedy_full": int(full.argmax()),
                    "greedy_split": int(split.argmax()),
                    "same_token": int(full.argmax()) == int(split.argmax()),
                    "kv_bytes": s["bytes"],
                    "stage_s": s["stage_s"],
                    "send_s": s["send_s"],
                    "load_s": load_s,
                }
            )
    transfer.close()
    return {
        "shape": shape,
        "device": device,
        "dtype": dtype,
        "prompt_len": prompt_len,
        "max_abs_logit": scale,
        "processes": 2,
        "transport": transport,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefix-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="tiny-llama")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--transport", choices=("shm", "mooncake"), default="shm")
    args = ap.parse_args(argv)
    if args.prefix_worker:
        print(json.dumps(_prefix_worker(json.loads(args.prefix_worker))))
        return 0
    report = split_check(
        args.shape, args.device, args.dtype, args.prompt_len, transport=args.transport
    )
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
