"""How much the context-blind suffix predictor matters to the simulator (issue #14: "the
suffix's extend cost, which grows with context length").

The profiles' ``T_sfx(x) = s2 x^2 + s1 x + s0`` does not depend on the prefix the suffix
attends over, nor do the simulator's true step times (``StepTimes.decode``). An extend of x
tokens on top of a prefix of p tokens also attends over the prefix: with the prefill's own
attention coefficient, ``T_pre(p + x) - T_pre(p)`` has the cross term ``2 c2 p x`` more. This
probe adds that term to the *true* decode step times only (the schedulers, their budgets and
the forecast keep the profile's predictor, as a deployment whose profile missed it would),
and runs FluidToken alone at static splits of two matrix cells, with and without it.

    python suffix_context.py > suffix_context.txt
"""

from __future__ import annotations

from dataclasses import replace

from fluidpd.core import step_times
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment, good_mask
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

CELLS = (
    (rb.Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "relaxed", 4, 0.9), (1, 2)),
    (rb.Cell("long-short-bursty", ("llama-3.1-8b", "a100-80gb"), "relaxed", 8, 0.9), (4, 5, 6)),
    (rb.Cell("long-chat-poisson", ("llama-3.1-8b", "a100-80gb"), "strict", 4, 0.9), (1, 2, 3)),
    (rb.Cell("long-short-poisson", ("llama-3.1-8b", "h200"), "strict", 8, 0.9), (4, 5, 6)),
)
BLIND = step_times.StepTimes.decode


def with_prefix(c2: float):  # type: ignore[no-untyped-def]
    def decode(self: step_times.StepTimes, batch: DecodeBatch) -> float:
        t = self._decode.time(batch.batch, batch.context) if batch.batch else 0.0
        for req in batch.suffix:
            prefix = req.prompt_len - req.stolen
            t += self._suffix.time(req.stolen) + 2.0 * c2 * prefix * req.stolen
        return t * self.factor()  # one noise draw a step, as BLIND draws

    return decode


def main() -> None:
    for cell, splits in CELLS:
        setup = rb.setup_cell(cell, 0, rb.SIZES["full"])
        assert setup is not None
        w, base = setup.workload, setup.base
        trace_s = float(w.arrivals[-1])
        aware = with_prefix(base.profile.prefill_predictor().c2)
        for p in splits:
            out = []
            for label, decode in (("blind", BLIND), ("with prefix", aware)):
                step_times.StepTimes.decode = decode  # type: ignore[method-assign]
                run = replace(base, n_prefill=p, n_decode=cell.workers - p)
                r = simulate(w, replace(run, mechanisms=MECHANISMS["fluidtoken"]))
                tpot = good_mask(r.requests, base.slo)[1].mean()
                out.append(
                    f"{label} {100 * attainment(r.requests, base.slo):.1f} % (TPOT"
                    f" {100 * tpot:.1f} %, {r.stolen_tokens / trace_s:.0f} tokens/s stolen)"
                )
            step_times.StepTimes.decode = BLIND  # type: ignore[method-assign]
            print(f"{cell.label} seed 0 {p}P{cell.workers - p}D, FluidToken: " + "; ".join(out))


if __name__ == "__main__":
    main()
