"""Does a request's greedy decode on the gpu engine depend on the batch it runs in? (issue #15:
the migrate drain's outputs are compared token for token with an unmigrated run, and a
migration grows the target's batch, e.g. 30 -> 62 requests, decode bucket 32 -> 64.)

The same ``--group`` prompts are prefilled twice (rids A and A', one request at a time, so
their KV is identical) and decoded greedily for ``--steps`` steps: A alone (its bucket), A'
beside ``--others`` more requests (a larger bucket). Reports, per pair of sizes, how many of
the group's rows ever chose a different token, the first step that happened, and the largest
logit difference at step 0 (the inputs are bit-identical there).

``python scripts/gpu/batch_invariance.py --out X.json [--shape llama-3.1-8b]``
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from fluidpd_sidecar.gpu.config import resolve_shape
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions


def compare(runner: ModelRunner, prompts: list[list[int]], others: list[list[int]],
            base: int, steps: int) -> dict[str, Any]:  # fmt: skip
    """Decodes ``prompts`` alone and beside ``others``; rids from ``base``."""
    n = len(prompts)
    alone = [base + j for j in range(n)]
    mixed = [base + 1000 + j for j in range(n)]
    extra = [base + 2000 + j for j in range(len(others))]
    last: dict[int, int] = {}
    for rids, ps in ((alone, prompts), (mixed, prompts), (extra, others)):
        for rid, p in zip(rids, ps, strict=True):
            last[rid] = int(runner.prefill(rid, p).argmax())
    differ: set[int] = set()
    first: int | None = None
    diff0 = 0.0
    for s in range(steps):
        runner.step(alone, [last[r] for r in alone])
        a = runner.greedy(n)
        la = runner.logits(n).clone()
        batch = mixed + extra
        runner.step(batch, [last[r] for r in batch])
        b = runner.greedy(len(batch))
        lb = runner.logits(n).clone()
        if s == 0:
            diff0 = float((la - lb).abs().max())
        for j in range(n):
            if a[j] != b[j]:
                differ.add(j)
                first = s if first is None else first
        # Each group continues from its own tokens (a flip then changes that row's inputs).
        for j, rid in enumerate(alone):
            last[rid] = a[j]
        for j, rid in enumerate(batch):
            last[rid] = b[j]
    for rid in alone + mixed + extra:
        runner.release(rid)
    return {"group": n, "beside": len(others), "buckets": [runner._bucket(n),
            runner._bucket(n + len(others))], "rows_that_differ": len(differ),
            "first_step_differing": first, "max_logit_diff_step0": diff0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--pairs", default="16:16,24:8,30:2,30:32,32:32,48:16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = resolve_shape(args.shape)
    t0 = time.time()
    runner = ModelRunner(cfg, RunnerOptions(device="cuda:0", kv_tokens=400_000, page_size=16,
                                            max_context=4096, max_batch=256))  # fmt: skip
    runner.capture()
    rng = random.Random(0)
    out: dict[str, Any] = {"shape": cfg.name, "torch": torch.__version__,
                           "device": torch.cuda.get_device_name(0), "pairs": []}  # fmt: skip
    for k, pair in enumerate(args.pairs.split(",")):
        g, o = (int(x) for x in pair.split(":"))
        prompts = [[rng.randrange(10, 500) for _ in range(args.prompt_len)] for _ in range(g)]
        others = [[rng.randrange(10, 500) for _ in range(args.prompt_len)] for _ in range(o)]
        res = compare(runner, prompts, others, 10_000 * (k + 1), args.steps)
        out["pairs"].append(res)
        print(json.dumps(res), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    out["s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
