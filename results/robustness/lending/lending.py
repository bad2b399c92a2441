"""How much prefill work FluidToken's decode workers really take over, against what the
forecast counts (``CapacityModel.lent_on``; issue #14, session 2026-12-05, ninth).

For each cell given, at each static split: the forecast's bound of the help (in prefill
workers), the prefill load ratio without and with it at the trace's mean demand, and the
simulator's static and FluidToken-only attainment with the prompt tokens stolen per second
and the prefill workers' worth they save (stolen tokens times the trace's mean prefill
seconds per prompt token: the average, not the marginal cost of a suffix, so a lower bound).

    python lending.py OUT.jsonl

prints one line per cell and split and writes them as JSON rows.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np

from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.policy_forecast import CapacityModel, Demand, Split
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

#: (cell, seed): the P->D cell the forecast refused without the help, and a D->P cell whose
#: prefill pool is past capacity at the even split.
CELLS = (
    (rb.Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "relaxed", 4, 0.9), 0),
    (rb.Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "relaxed", 4, 0.9), 1),
    (rb.Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "relaxed", 4, 1.2), 1),
    (rb.Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "medium", 4, 0.6), 0),
    (rb.Cell("long-short-bursty", ("llama-3.1-8b", "a100-80gb"), "relaxed", 8, 0.9), 0),
)


def rows(cell: rb.Cell, seed: int) -> list[dict[str, object]]:
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    w, base = setup.workload, setup.base
    model = CapacityModel.from_profile(base.profile, base.slo, FluidTokenConfig())
    prompts = w.prompt_lens.astype(np.float64)
    trace_s = float(w.arrivals[-1])
    pre = float(np.mean(model.prefill.time(prompts)))
    d = Demand(len(w) / trace_s, float(prompts.mean()), float(w.output_lens.mean()), pre)
    out = []
    for p in range(1, cell.workers):
        split = Split(p, cell.workers - p)
        lent = model.lent_on(d, split)
        row: dict[str, object] = {
            "cell": cell.label,
            "seed": seed,
            "rps": setup.rps,
            "split": f"{p}P{cell.workers - p}D",
            "lent_bound": round(lent, 3),
            "prefill_ratio": round(model.prefill_ratio(d, p), 3),
            "prefill_ratio_helped": round(model.prefill_ratio(d, p, lent), 3),
        }
        for policy in ("static", "fluidtoken"):
            run = replace(base, n_prefill=p, n_decode=cell.workers - p)
            result = simulate(w, replace(run, mechanisms=MECHANISMS[policy]))
            row[policy] = round(attainment(result.requests, base.slo), 4)
        stolen = result.stolen_tokens / trace_s
        row["stolen_tokens_per_s"] = round(stolen, 1)
        row["saved_prefill_workers"] = round(stolen * pre / float(prompts.mean()), 3)
        out.append(row)
    return out


def main() -> None:
    with open(sys.argv[1], "w") as f:
        for cell, seed in CELLS:
            for row in rows(cell, seed):
                f.write(json.dumps(row) + "\n")
                print(
                    f"{row['cell']} seed {seed} {row['split']}: bound {row['lent_bound']:.2f}"
                    f" ratio {row['prefill_ratio']:.2f} -> {row['prefill_ratio_helped']:.2f};"
                    f" static {100 * float(row['static']):.1f} %, FluidToken"
                    f" {100 * float(row['fluidtoken']):.1f} %, stolen"
                    f" {row['stolen_tokens_per_s']:.0f} tokens/s"
                    f" ({row['saved_prefill_workers']:.2f} prefill workers)"
                )


if __name__ == "__main__":
    main()
