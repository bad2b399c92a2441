"""D->P drain ``migrate`` of a decode worker holding N active requests, with real KV (gpu
engine; shm or cuda-ipc transport, as the ``fluidpd up`` arguments say), against the same
requests never migrated.

A 1P2D stack; phase ``reference`` sends the N*2 requests (greedy, ``--prompt-len``-token
prompts, ``--max-tokens`` outputs) and nothing switches; phase ``migrate`` sends the same
requests and, once decode worker w1 holds ``--active`` of them, switches w1 to prefill with
drain ``migrate`` towards w2. Reports the drain time (the sidecar's own record: drain start to
Active in the new role, and its ``last_drain`` phases: adoption, export, transfer, activation,
the last request taken over by its peer), how many requests moved, and whether every output
equals its reference text. Different batch compositions can flip a bf16 argmax without any
migration, so a ``control`` phase (the reference again) says how often that happens by itself.

``python scripts/gpu/migrate_drain.py --out X.json -- <extra fluidpd up args>``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from fluidpd.drills.admin import admin_session, get_json
from fluidpd.drills.stack import LocalStack


async def _one(s: aiohttp.ClientSession, endpoint: str, model: str, ids: list[int],
               max_tokens: int) -> dict[str, Any]:  # fmt: skip
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    async with s.post(f"{endpoint}/v1/completions", json=body,
                      timeout=aiohttp.ClientTimeout(total=600)) as r:  # fmt: skip
        data = await r.json()
    if r.status != 200:
        return {"error": str(data)[:300]}
    return {"text": data["choices"][0]["text"], "tokens": data["usage"]["completion_tokens"]}


async def set_role(stack: LocalStack, worker: str, role: str, settle: float = 1.5) -> None:
    """Switches ``worker`` (idle) to ``role`` and waits until it is Active there, and then
    ``settle`` seconds for the router to see it (it polls ``/pressure`` twice a second)."""
    url = stack.workers[worker]
    async with admin_session(stack.token) as s:
        async with s.post(f"{url}/role", json={"role": role}) as r:
            assert r.status == 200, await r.text()
        while True:
            p = await get_json(s, f"{url}/pressure")
            if p["role"] == role and p["state"] == "active":
                break
            await asyncio.sleep(0.01)
    await asyncio.sleep(settle)


async def phase(stack: LocalStack, model: str, prompts: list[list[int]], max_tokens: int,
                switch_at: int | None, idle_target: bool = False) -> dict[str, Any]:  # fmt: skip
    """``idle_target``: w2 is a prefill worker until w1 holds its requests, then a decode
    worker with none of its own when w1 switches (its batch after the drain is w1's)."""
    async with admin_session(stack.token) as s:
        tasks = [asyncio.create_task(_one(s, stack.endpoint, model, p, max_tokens))
                 for p in prompts]  # fmt: skip
        switch: dict[str, Any] = {}
        if switch_at is not None:
            w1, w2 = stack.workers["w1"], stack.workers["w2"]
            # Until w1 holds ``switch_at``, or its batch has peaked below that (it shrinks
            # again: outputs end faster than prompts arrive), or 60 s. (Waiting the full 60 s
            # for a peak that has passed switched an empty worker on 2026-12-02.)
            t_wait, most = time.time(), 0
            while time.time() - t_wait < 60:
                now = (await get_json(s, f"{w1}/pressure"))["batch"]
                most = max(most, now)
                if most >= switch_at or (most >= 4 and now <= most - 2):
                    break
                await asyncio.sleep(0.02)
            if idle_target:
                # Every request is on w1 now (paired when it arrived): the router may see w2
                # as a decode worker whenever it likes.
                await set_role(stack, "w2", "decode", settle=0.0)
            print(f"switching w1 with {most} active", flush=True)
            before = await get_json(s, f"{w1}/pressure")
            # The target's room at the switch: what the drain's plan sees of it.
            peer = await get_json(s, f"{w2}/pressure")
            body = {"role": "prefill", "drain": "migrate", "migrate_to": [w2]}
            t0 = time.time()
            async with s.post(f"{w1}/role", json=body) as r:
                assert r.status == 200, await r.text()
            while True:
                p = await get_json(s, f"{w1}/pressure")
                if p["switches"] > before["switches"]:
                    break
                await asyncio.sleep(0.01)
            switch = {"active_at_switch": before["batch"], "drain_s":
                      round(p["last_switch_finished"] - p["last_switch_started"], 3),
                      "observed_s": round(time.time() - t0, 3), "t0": t0,
                      "peer_at_switch": {k: peer.get(k) for k in
                                         ("batch", "kv_capacity", "kv_used", "kv_reserved")},
                      }  # fmt: skip
        results = await asyncio.gather(*tasks)
        if switch_at is not None:
            # The sidecar's own record of where the drain's time went (every move has ended:
            # all requests answered).
            role = await get_json(s, f"{stack.workers['w1']}/role")
            switch["phases"] = role.get("last_drain")
    return {"switch": switch, "results": results}


def moves_after(log: Path, t0: float) -> dict[str, Any]:
    """When w1's moves ended: its ``request N migrated to URL`` lines after the switch at
    ``t0`` (the drain ends when the last request left w1's batch; its KV may still be on its
    way, so the time the last one was activated on its new worker is reported beside it)."""
    times = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        if " migrated to " not in line:
            continue
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stamp >= t0:
            times.append(stamp - t0)
    if not times:
        return {"moved": 0}
    return {"moved": len(times), "first_s": round(min(times), 3), "last_s": round(max(times), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--active", type=int, default=32, help="active requests on w1 at the switch")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--model", default="llama-3.1-8b", help="the served model name")
    ap.add_argument("--no-control", action="store_true", help="skip the control phase")
    ap.add_argument("--idle-target", action="store_true",
                    help="send --active requests, not twice that, all decoded on w1 (w2 is "
                    "a prefill worker until just before the drain): the target's batch after "
                    "the drain is w1's, in the reference's decode bucket")  # fmt: skip
    ap.add_argument("--out", required=True)
    ap.add_argument("up", nargs="*", help="after --: extra fluidpd up arguments")
    args = ap.parse_args()
    rng = random.Random(0)
    # Ids every model here has (the tiny CPU twins have 512): random prompts, so no prefix is
    # shared between requests.
    n = args.active if args.idle_target else 2 * args.active
    prompts = [[rng.randrange(10, 500) for _ in range(args.prompt_len)]
               for _ in range(n)]  # fmt: skip
    run_dir = Path(args.out).parent / "migrate-drain-stack"
    out: dict[str, Any] = {"command": "python " + " ".join(sys.argv), "args": vars(args)}
    ref_text: list[str | None] = []

    def same(res: dict[str, Any]) -> dict[str, Any]:
        texts = [r.get("text") for r in res["results"]]
        errors = [r["error"] for r in res["results"] if "error" in r]
        pairs = zip(texts, ref_text, strict=True)
        return {"equal": sum(a is not None and a == b for a, b in pairs),
                "of": len(texts), "errors": errors[:5], "n_errors": len(errors)}  # fmt: skip

    def save(note: str) -> None:
        # After each phase: a run cut short by its time limit still says how far it got.
        out["progress"] = note
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(note, flush=True)

    t0 = time.time()
    with LocalStack(run_dir, "1P2D", "static", *args.up, token="migrate-drain") as stack:
        out["ready_s"] = round(time.time() - t0, 1)
        if args.idle_target:
            asyncio.run(set_role(stack, "w2", "prefill"))
        save(f"stack ready after {out['ready_s']} s")
        ref = asyncio.run(phase(stack, args.model, prompts, args.max_tokens, None))
        ref_text = [r.get("text") for r in ref["results"]]
        save(f"reference phase done at {time.time() - t0:.0f} s")
        if not args.no_control:
            ctl = asyncio.run(phase(stack, args.model, prompts, args.max_tokens, None))
            out["control_vs_reference"] = same(ctl)
            save(f"control phase done at {time.time() - t0:.0f} s")
        mig = asyncio.run(phase(stack, args.model, prompts, args.max_tokens, args.active,
                                args.idle_target))  # fmt: skip
        out["migrated_vs_reference"] = same(mig)
        out["switch"] = mig["switch"]
        out["moves"] = moves_after(run_dir / "w1.log", mig["switch"].get("t0", 0.0))
        save(f"migrate phase done at {time.time() - t0:.0f} s")
        out["orphans"] = stack.stop()
    save("done")
    print(json.dumps({k: v for k, v in out.items() if k != "args"}, indent=1))


if __name__ == "__main__":
    main()
