"""FluidToken split equivalence on SGLang: prefix on a prefill server + suffix extend on a
decode server gives the same greedy output as plain (non-disaggregated) SGLang.

Two SGLang servers started through FluidPD's launcher (scheduler hook + FluidToken hook,
``fluidpd_sidecar/sglang/fluidtoken_hook.py``): prefill and decode, KV over SGLang's own Mooncake
transfer; then one plain server. For each beta and prompt of length L, with
``p = round((1 - beta) L)`` (FluidPD's forced-steal rule, ``PrefillSide.next_batch``): the
split is registered with the decode server's hook, the decode server gets the whole prompt and
the prefill server ``ids[:p]`` under one bootstrap room (p = 0: the prefill server gets nothing
and forgets the room). Each output (N new tokens, greedy) is compared with

* ``plain``: the plain server on the whole prompt, cold (radix cache flushed) — the claim;
* ``plain_cached``: the plain server after it computed ``ids[:p]`` (its radix cache then holds
  the prefix, so it runs the same prefix-then-suffix kernels) — tells a FluidToken bug from
  kernel reduction order when ``plain`` differs at a near tie.

Writes OUT/sglang_split.json after every step (partial results survive a timeout).

usage (H200, see sglang_split.sh): python3 scripts/gpu/sglang_split.py --out $OUT
CPU: --device cpu --model-dir DIR --python ~/.cache/fluidpd/sglang-venv/bin/python
     --max-total-tokens 4096 --lengths 5,23,61 --new 16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import (
    add_stack_args,
    model_dir,
    random_ids,
    term_as_interrupt,
    vocab_size,
    write_json,
)
from sglang_stack import generate as sglang_generate

BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)


def prefix_len(beta: float, length: int) -> int:
    """FluidPD's forced-steal split (``PrefillSide.next_batch``): ``p = round((1 - beta) L)``."""
    return round((1.0 - beta) * length)


def write(out: Path, rep: dict[str, Any]) -> None:
    write_json(out / "sglang_split.json", rep)


def add_pair_args(p: argparse.ArgumentParser, *, mem_p: float, mem_d: float) -> None:
    """The flags ``config`` reads beside ``add_stack_args``'s, with a script's memory split."""
    p.add_argument("--mem-p", type=float, default=mem_p)
    p.add_argument("--mem-d", type=float, default=mem_d)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--sglang-arg", action="append", default=[])


def config(args: argparse.Namespace, model: Path, out: Path, name: str, **kw: Any) -> SglangConfig:
    port, hook = free_ports(2)
    mem = kw.pop("mem")
    gpu = args.device != "cpu"
    return SglangConfig(
        python=args.python,
        model_dir=model,
        port=port,
        hook_port=hook,
        device=args.device,
        load_format=None if args.model_dir else "dummy",
        max_total_tokens=args.max_total_tokens,
        context_length=args.context_length,
        extra_args=tuple(args.sglang_arg),
        log_path=out / f"sglang-{name}.log",
        start_timeout_s=args.start_timeout,
        mem_fraction=mem if gpu else None,
        **kw,
    )


async def generate(
    c: httpx.AsyncClient, url: str, ids: list[int], new: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Greedy, ``ignore_eos``, with the top two log-probabilities (near ties)."""
    return await sglang_generate(c, url, ids, new, extra, logprobs=True)


def _ids(out: dict[str, Any]) -> list[int]:
    return [int(x) for x in out.get("output_ids") or []]


def _margin(out: dict[str, Any], k: int) -> float | None:
    """Top-1 minus top-2 log-probability at output position ``k`` (how near a tie it was)."""
    tops = (out.get("meta_info") or {}).get("output_top_logprobs") or []
    if k >= len(tops) or not tops[k] or len(tops[k]) < 2:
        return None
    return float(tops[k][0][0]) - float(tops[k][1][0])


def divergence(a: list[int], b: list[int]) -> int | None:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def bootstrap(p: SglangServer, room: int) -> dict[str, Any]:
    """The body fields that pair a request's two halves under one bootstrap ``room``."""
    return {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": p.cfg.bootstrap_port,
        "bootstrap_room": room,
    }


async def split(
    c: httpx.AsyncClient, p: SglangServer, d: SglangServer, rid: int, ids: list[int], pre: int,
    suffix_s: float = 0.0, tpot: float = 0.0, step_s: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """Tell the hooks how ``rid``'s prompt is split at ``pre`` (the decode hook the suffix,
    with its predicted extend seconds, TPOT target and what its stream adds to a decode step;
    the prefill hook to forget a room it will never see, at ``pre`` 0); the bootstrap fields
    of its two halves."""
    if pre < len(ids):
        body = {"rid": str(rid), "suffix": len(ids) - pre, "suffix_s": suffix_s, "tpot": tpot,
                "step_s": step_s}  # fmt: skip
        r = await c.post(f"http://127.0.0.1:{d.cfg.hook_port}/split", json=body)
        r.raise_for_status()
    if pre == 0:
        r = await c.post(f"http://127.0.0.1:{p.cfg.hook_port}/forget", json={"room": rid})
        r.raise_for_status()
    return bootstrap(p, rid)


async def run_split(
    c: httpx.AsyncClient, p: SglangServer, d: SglangServer, rid: int, ids: list[int], pre: int,
    new: int,
) -> dict[str, Any]:  # fmt: skip
    boot = await split(c, p, d, rid, ids, pre)
    t0 = time.perf_counter()
    jobs = [generate(c, d.cfg.url, ids, new, {"rid": str(rid), **boot})]
    if pre > 0:
        jobs.append(generate(c, p.cfg.url, ids[:pre], 1, {"rid": f"{rid}-p", **boot}))
    res = await asyncio.gather(*jobs)
    return {"out": res[0], "wall_s": time.perf_counter() - t0}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir(args, args.work)
    vocab = vocab_size(model)
    rng = random.Random(13)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = [random_ids(rng, n, vocab) for n in lengths]
    rep: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "betas": list(BETAS),
        "lengths": lengths,
        "new_tokens": args.new,
        "cases": [],
    }
    bp = free_ports(1)[0]
    pcfg = config(args, model, out, "p", mem=args.mem_p, mode="prefill", bootstrap_port=bp,
                  transfer_backend="mooncake")  # fmt: skip
    # The suffix extend is wired into SGLang's non-overlap decode loop.
    dcfg = config(args, model, out, "d", mem=args.mem_d, mode="decode",
                  transfer_backend="mooncake")  # fmt: skip
    dcfg = dataclasses.replace(dcfg, extra_args=(*dcfg.extra_args, "--disable-overlap-schedule"))
    pserver, dserver = SglangServer(pcfg), SglangServer(dcfg)
    t0 = time.monotonic()
    outputs: dict[tuple[int, float], dict[str, Any]] = {}
    try:
        print("starting prefill and decode servers", flush=True)
        await asyncio.gather(pserver.start(), dserver.start())
        rep["pd_start_s"] = time.monotonic() - t0
        print(f"P/D up in {rep['pd_start_s']:.1f} s", flush=True)
        write(out, rep)
        async with httpx.AsyncClient(timeout=args.request_timeout) as c:
            rid = 1000
            for beta in BETAS:
                for k, ids in enumerate(prompts):
                    rid += 1
                    pre = prefix_len(beta, len(ids))
                    res = await run_split(c, pserver, dserver, rid, ids, pre, args.new)
                    outputs[(k, beta)] = res["out"]
                    rep["cases"].append({
                        "beta": beta, "prompt_len": len(ids), "prefix": pre,
                        "pd_ids": _ids(res["out"]), "pd_wall_s": round(res["wall_s"], 4),
                        "cached_tokens": (res["out"].get("meta_info") or {}).get("cached_tokens"),
                    })  # fmt: skip
                    print(f"beta {beta} L {len(ids)} p {pre}: {res['wall_s']:.3f} s", flush=True)
                    write(out, rep)
            snap = (await c.get(f"http://127.0.0.1:{dcfg.hook_port}/")).json()
            rep["decode_hook"] = {"fluid": snap.get("fluid"), "pending": snap.get("fluid_pending"),
                                  "kv_used": snap.get("kv_used"),
                                  "kv_capacity": snap.get("kv_capacity")}  # fmt: skip
    except Exception as exc:
        rep["error"] = repr(exc)
        print("P/D error:", repr(exc), flush=True)
    finally:
        await asyncio.gather(pserver.stop(), dserver.stop())
    write(out, rep)
    if "error" in rep:
        return rep
    plain = SglangServer(config(args, model, out, "plain", mem=args.mem_plain))
    try:
        t1 = time.monotonic()
        await plain.start()
        rep["plain_start_s"] = time.monotonic() - t1
        print(f"plain up in {rep['plain_start_s']:.1f} s", flush=True)
        async with httpx.AsyncClient(timeout=args.request_timeout) as c:
            cold: dict[int, dict[str, Any]] = {}
            for k, ids in enumerate(prompts):
                await c.post(f"{plain.cfg.url}/flush_cache")
                cold[k] = await generate(c, plain.cfg.url, ids, args.new)
            for case in rep["cases"]:
                k = lengths.index(case["prompt_len"])
                ref = _ids(cold[k])
                await c.post(f"{plain.cfg.url}/flush_cache")
                if case["prefix"] > 0:
                    await generate(c, plain.cfg.url, prompts[k][: case["prefix"]], 1)
                cached = await generate(c, plain.cfg.url, prompts[k], args.new)
                got = case["pd_ids"]
                div = divergence(got, ref)
                case.update({
                    "plain_ids": ref, "equal_plain": got == ref, "first_divergence": div,
                    "plain_margin_at_divergence": _margin(cold[k], div) if div is not None
                    else None,
                    "equal_plain_cached": got == _ids(cached),
                    "plain_cached_tokens": (cached.get("meta_info") or {}).get("cached_tokens"),
                })  # fmt: skip
                write(out, rep)
    except Exception as exc:
        rep["plain_error"] = repr(exc)
    finally:
        await plain.stop()
    cases = rep["cases"]
    rep["summary"] = {
        str(b): {key: [c[key] for c in cases if c["beta"] == b and key in c]
                 for key in ("equal_plain", "equal_plain_cached")}
        for b in BETAS
    }  # fmt: skip
    rep["all_equal_plain"] = bool(cases) and all(c.get("equal_plain") for c in cases)
    write(out, rep)
    return rep


def main() -> int:
    # ``timeout`` sends SIGTERM: unwind through the ``finally`` blocks, which stop the SGLang
    # servers (they run in their own sessions and would outlive this process).
    term_as_interrupt()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_stack_args(p, work="/tmp/sglang-model", start_timeout=300.0)
    add_pair_args(p, mem_p=0.3, mem_d=0.6)
    p.add_argument("--mem-plain", type=float, default=0.8)
    p.add_argument("--lengths", default="37,300,1000")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=300.0)
    args = p.parse_args()
    rep = asyncio.run(main_async(args))
    short = {k: v for k, v in rep.items() if k != "cases"}
    print(json.dumps(short, indent=1))
    return 1 if "error" in rep or "plain_error" in rep else 0


if __name__ == "__main__":
    raise SystemExit(main())
