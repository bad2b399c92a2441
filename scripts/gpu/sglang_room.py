"""FluidToken's TPOT room on a real SGLang decode server: stolen suffixes extended on a decode
worker while it streams, with the room (each split registered with its predicted extend
seconds and the TPOT target, as the decode sidecar does) against without it (``tpot`` 0, the
hook's "nothing to keep": only one extend per iteration and a decode step between two).

Two SGLang servers through FluidPD's launcher (scheduler hook + FluidToken hook), prefill and
decode, KV over SGLang's Mooncake transfer. Each arm, on the same servers with every radix
cache flushed first and the same prompts:

* ``--streams`` background requests through ordinary P/D (prompt on the prefill server, KV
  transferred, ``--stream-new`` tokens streamed by the decode server);
* once all of them stream, ``--steal`` requests of ``--steal-len`` tokens whose whole prompt is
  stolen (beta 1: the prefill server forgets the room, the decode server runs the prompt as one
  extend), one every ``--steal-gap`` seconds.

Arms ``alone`` (streams only: their TPOT without stealing), then for each TPOT target
``room`` / ``no_room`` alternating ``--repeats`` times, then ``static`` (the same long prompts at
the same times through ordinary P/D: what FluidToken must not do worse than); last,
``room_under``: the room with every
prediction ``--under`` x the truth (a profile of a faster GPU), which the hook's extend stretch
must learn. The TPOT targets are ``--tpot-factor`` (a list) x the median TPOT of the ``alone``
streams; a stolen split's predicted seconds is its extend measured alone (TTFT of one stolen
request with nothing running, the second of two). Per arm: the TPOT (mean gap between a
request's first and last token) of the background streams and of the stolen requests against
the target, the largest gap, the stolen requests' TTFT, and the hook's extends, held
iterations and extend seconds (measured, predicted).

Writes OUT/sglang_room.json after every arm.

usage (GPU, see sglang_room.sh): python3 scripts/gpu/sglang_room.py --out $OUT
CPU: --device cpu --model-dir DIR --python ~/.cache/fluidpd/sglang-venv/bin/python
     --max-total-tokens 4096 --streams 3 --stream-prompt 16 --stream-new 24 --steal 3
     --steal-len 200 --steal-new 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import random
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from fluidpd.profiles import ProfileError, resolve_profile
from fluidpd_sidecar.sglang.server import SglangServer, free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_split import add_pair_args, bootstrap, config, split
from sglang_stack import (
    add_stack_args,
    model_dir,
    pct,
    random_ids,
    term_as_interrupt,
    vocab_size,
    write_json,
)


@dataclasses.dataclass
class Pair:
    """The prefill and the decode server."""

    p: SglangServer
    d: SglangServer


async def stream(
    c: httpx.AsyncClient, url: str, ids: list[int], new: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """SGLang's ``/generate`` streamed (greedy, ``ignore_eos``): when the request was sent and
    each chunk's arrival with the tokens out by then."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
        **extra,
    }
    sent = time.perf_counter()
    chunks: list[tuple[float, int]] = []
    async with c.stream("POST", f"{url}/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}/generate: {r.status_code} {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            meta = json.loads(line[5:]).get("meta_info") or {}
            chunks.append((time.perf_counter(), int(meta.get("completion_tokens", 0))))
    return {"sent": sent, "chunks": chunks}


def tpot(run: dict[str, Any]) -> float | None:
    """The mean gap between the first and the last token (what a TPOT SLO holds)."""
    ch = run["chunks"]
    if len(ch) < 2 or ch[-1][1] <= ch[0][1]:
        return None
    return float((ch[-1][0] - ch[0][0]) / (ch[-1][1] - ch[0][1]))


def largest_gap(run: dict[str, Any]) -> float:
    ch = run["chunks"]
    return max((b[0] - a[0] for a, b in itertools.pairwise(ch)), default=0.0)


def ttft(run: dict[str, Any]) -> float | None:
    return run["chunks"][0][0] - run["sent"] if run["chunks"] else None


async def decode_snapshot(c: httpx.AsyncClient, pair: Pair) -> dict[str, Any]:
    """The decode server's hook snapshot (its queues, batch and FluidToken counters)."""
    return dict((await c.get(f"http://127.0.0.1:{pair.d.cfg.hook_port}/")).json())


def fluid_counters(snap: dict[str, Any]) -> dict[str, Any]:
    """The FluidToken hook's counters in a decode snapshot."""
    return dict(snap.get("fluid") or {})


async def stolen(
    c: httpx.AsyncClient, pair: Pair, room: int, ids: list[int], new: int, suffix_s: float,
    target: float, step_s: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """One request whose whole prompt is stolen: registered with the decode hook (``target``
    0: no TPOT room), forgotten by the prefill side, extended by the decode server."""
    boot = await split(c, pair.p, pair.d, room, ids, 0, suffix_s, target, step_s)
    return await stream(c, pair.d.cfg.url, ids, new, {"rid": str(room), **boot})


async def background(
    c: httpx.AsyncClient, pair: Pair, room: int, ids: list[int], new: int
) -> dict[str, Any]:
    """One request through ordinary P/D: prefill server, KV transfer, decode server."""
    boot = bootstrap(pair.p, room)
    halves: tuple[dict[str, Any], dict[str, Any]] = await asyncio.gather(
        stream(c, pair.d.cfg.url, ids, new, {"rid": str(room), **boot}),
        stream(c, pair.p.cfg.url, ids, 1, {"rid": f"{room}-p", **boot}),
    )
    return halves[0]


async def flush(c: httpx.AsyncClient, pair: Pair) -> None:
    for s in (pair.p, pair.d):
        await c.post(f"{s.cfg.url}/flush_cache")


async def arm(
    c: httpx.AsyncClient, pair: Pair, args: argparse.Namespace, prompts: dict[str, Any],
    room0: int, suffix_s: float, target: float | None, steal: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Streams, and (``target`` not None) stolen requests once every stream has its first
    token; ``target`` 0 registers them without a TPOT room. ``steal`` False: the same
    requests at the same times through ordinary P/D instead (the static split's answer)."""
    await flush(c, pair)
    before = fluid_counters(await decode_snapshot(c, pair))
    bg = [
        asyncio.create_task(background(c, pair, room0 + k, ids, args.stream_new))
        for k, ids in enumerate(prompts["streams"])
    ]
    st: list[asyncio.Task[dict[str, Any]]] = []
    t0 = time.perf_counter()
    if target is not None:
        # The stolen requests come once every stream is running (its first token is out).
        while True:
            await asyncio.sleep(0.01)
            snap = await decode_snapshot(c, pair)
            if int(snap.get("decode_batch", 0)) >= len(bg) or all(t.done() for t in bg):
                break
            if time.perf_counter() - t0 > args.request_timeout:
                raise RuntimeError("the background streams never all ran")
        for k, ids in enumerate(prompts["steal"]):
            room = room0 + 500 + k
            st.append(asyncio.create_task(
                stolen(c, pair, room, ids, args.steal_new, suffix_s, target, args.step_s) if steal
                else background(c, pair, room, ids, args.steal_new)))  # fmt: skip
            await asyncio.sleep(args.steal_gap)
    streams = await asyncio.gather(*bg)
    steals = await asyncio.gather(*st)
    snap = await decode_snapshot(c, pair)
    after = fluid_counters(snap)
    return {
        "target": target,
        "streams": summarize(streams, target or 0.0),
        "stolen": {**summarize(steals, target or 0.0),
                   "ttft_s": [round(x, 4) for x in map(ttft, steals) if x is not None]},
        "hook": {k: after.get(k, 0) - before.get(k, 0) for k in HOOK_COUNTERS},
        # What a stolen stream adds to a decode step, as the hook measured it by now.
        "joining_s": snap.get("fluid_joining_s"),
    }  # fmt: skip


HOOK_COUNTERS = ("extends", "extend_tokens", "held", "extend_seconds", "extend_predicted_seconds")


def summarize(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    tp = [x for x in map(tpot, runs) if x is not None]
    gaps = [largest_gap(r) for r in runs]
    out: dict[str, Any] = {
        "n": len(runs),
        "tpot_s": [round(x, 5) for x in tp],
        "tpot_median_s": median(tp) if tp else None,
        "tpot_max_s": max(tp, default=None),
        "largest_gap_max_s": max(gaps, default=None),
        "largest_gap_p50_s": pct(gaps, 0.5),
    }
    if target > 0:
        out["tpot_met"] = sum(x <= target for x in tp)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir(args, args.work)
    vocab = vocab_size(model)
    rng = random.Random(17)
    prompts = {
        "streams": [random_ids(rng, args.stream_prompt, vocab) for _ in range(args.streams)],
        "steal": [random_ids(rng, args.steal_len, vocab) for _ in range(args.steal)],
        "calib": [random_ids(rng, args.steal_len, vocab) for _ in range(2)],
    }
    rep: dict[str, Any] = {"command": " ".join(sys.argv), "arms": [], "step_s": args.step_s}
    bp = free_ports(1)[0]
    pcfg = config(args, model, out, "p", mem=args.mem_p, mode="prefill", bootstrap_port=bp,
                  transfer_backend="mooncake")  # fmt: skip
    dcfg = config(args, model, out, "d", mem=args.mem_d, mode="decode",
                  transfer_backend="mooncake")  # fmt: skip
    # The suffix extend is wired into SGLang's non-overlap decode loop.
    dcfg = dataclasses.replace(dcfg, extra_args=(*dcfg.extra_args, "--disable-overlap-schedule"))
    pair = Pair(SglangServer(pcfg), SglangServer(dcfg))
    t0 = time.monotonic()
    try:
        await asyncio.gather(pair.p.start(), pair.d.start())
        rep["pd_start_s"] = round(time.monotonic() - t0, 1)
        print(f"P/D up in {rep['pd_start_s']} s", flush=True)
        async with httpx.AsyncClient(timeout=args.request_timeout) as c:
            calib = []
            for k, ids in enumerate(prompts["calib"]):
                await flush(c, pair)
                calib.append(ttft(await stolen(c, pair, 900 + k, ids, 2, 0.0, 0.0)))
            suffix_s = float(calib[-1] or 0.0)
            rep["suffix_s"] = {"measured": calib, "used": suffix_s}
            alone = await arm(c, pair, args, prompts, 1000, suffix_s, None)
            alone_tpot = float(alone["streams"]["tpot_median_s"])
            targets = [f * alone_tpot for f in args.tpot_factor]
            rep.update(targets_s=targets, alone=alone)
            print(f"extend {suffix_s:.4f} s alone; streams alone {alone_tpot * 1e3:.2f} ms",
                  flush=True)  # fmt: skip
            write_json(out / "sglang_room.json", rep)
            plan = [(name, target, scale, r) for target in targets for r in range(args.repeats)
                    for name, scale in (("room", 1.0), ("no_room", 0.0))]  # fmt: skip
            # The static split: no stealing, the long prompts prefilled on the prefill server.
            plan += [("static", target, -1.0, 0) for target in targets]
            # Last: what the hook learns of extends slower than predicted stays with it.
            plan.append(("room_under", targets[-1], args.under, 0))
            for name, target, scale, r in plan:
                res = await arm(c, pair, args, prompts, 2000 + 1000 * len(rep["arms"]),
                                suffix_s * max(scale, 0.0), target if scale else 0.0,
                                steal=scale >= 0)  # fmt: skip
                # no_room registers tpot 0, but its requests are held to the same target.
                for side in ("streams", "stolen"):
                    res[side]["tpot_met"] = sum(x <= target for x in res[side]["tpot_s"])
                rep["arms"].append({"arm": name, "target_s": target, "repeat": r, **res})
                s, st, h = res["streams"], res["stolen"], res["hook"]
                print(f"{name} #{r} at {target * 1e3:.1f} ms: TPOT met streams "
                      f"{s['tpot_met']}/{s['n']} stolen {st['tpot_met']}/{st['n']}, medians "
                      f"{s['tpot_median_s'] * 1e3:.2f} / {st['tpot_median_s'] * 1e3:.2f} ms; "
                      f"stolen TTFT median {median(st['ttft_s']):.3f} s; extends "
                      f"{h['extends']}, held {h['held']}, extend s {h['extend_seconds']:.2f} "
                      f"(predicted {h['extend_predicted_seconds']:.2f}); a stolen stream adds "
                      f"{(res['joining_s'] or 0.0) * 1e3:.2f} ms a step", flush=True)  # fmt: skip
                write_json(out / "sglang_room.json", rep)
    except Exception as exc:
        rep["error"] = repr(exc)
        print("error:", repr(exc), flush=True)
    finally:
        await asyncio.gather(pair.p.stop(), pair.d.stop())
    write_json(out / "sglang_room.json", rep)
    return rep


def _factors(text: str) -> list[float]:
    """``--tpot-factor``: a comma-separated list of positive numbers."""
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or not all(x > 0 for x in out):
        raise argparse.ArgumentTypeError(f"want positive numbers like 2.0,1.5, not {text!r}")
    return out


def main() -> int:
    term_as_interrupt()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_stack_args(p, work="/tmp/sglang-model", start_timeout=300.0)
    # Both at 0.8 with a --max-total-tokens cap (sglang_stack.py): a small fraction fails when
    # the other server's weights are loaded first.
    add_pair_args(p, mem_p=0.8, mem_d=0.8)
    p.add_argument("--streams", type=int, default=24)
    p.add_argument("--stream-prompt", type=int, default=128)
    p.add_argument("--stream-new", type=int, default=400)
    p.add_argument("--steal", type=int, default=16)
    p.add_argument("--steal-len", type=int, default=6000)
    p.add_argument("--steal-gap", type=float, default=0.15)
    p.add_argument("--steal-new", type=int, default=32)
    p.add_argument("--tpot-factor", type=_factors, default=_factors("2.0,1.5"),
                   help="TPOT targets, multiples of the streams' TPOT alone")  # fmt: skip
    p.add_argument("--under", type=float, default=0.5,
                   help="room_under: predictions as this x the extend measured")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--profile-gpu", default="h100",
                   help="the Llama-3.1-8B profile whose eq. 13 predicts what a stolen stream "
                        "adds to a decode step, as the decode sidecar registers it")  # fmt: skip
    args = p.parse_args()
    try:
        profile = resolve_profile("llama-3.1-8b", args.profile_gpu, None)
    except ProfileError as exc:
        p.error(f"--profile-gpu: {exc}")
    args.step_s = profile.decode_predictor().added(args.steal_len)
    rep = asyncio.run(main_async(args))
    print(json.dumps({k: v for k, v in rep.items() if k not in ("arms", "alone")}, indent=1))
    return 1 if "error" in rep else 0


if __name__ == "__main__":
    raise SystemExit(main())
