"""The forecast's prefill queue model against the simulator: a prefill pool fed round-robin
misses TTFT as Kingman's one-worker-of-n queue says, not as n copies of the whole stream's
M/G/1 queue (which the forecast used first and which read a 5P3D split of 9K-token chats as
missing a fifth of its deadlines where it missed 4 %)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fluidpd.core.policy_forecast import PREFILL_QUANTILES, CapacityModel, Demand
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import build_workload


def test_round_robin_prefill_pools_miss_ttft_as_kingman_says() -> None:
    slo = SLO(2.0, 0.1)
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    model = CapacityModel.from_profile(profile, slo)
    whole = replace(model, split_arrivals=False)
    # Short outputs: decode never holds a request back, so every TTFT miss is the queue's.
    rps = 4.0
    w = build_workload("long-short-poisson", rps, seed=1, num_requests=800)
    pre = model.prefill.time(w.prompt_lens.astype(np.float64))
    quantiles = (np.arange(PREFILL_QUANTILES) + 0.5) / PREFILL_QUANTILES
    d = Demand(
        rps,
        float(w.prompt_lens.mean()),
        float(w.output_lens.mean()),
        float(pre.mean()),
        len(pre),
        True,
        prefill_s2=float((pre**2).mean()),
        arrival_cv2=1.0,
        prefill_quantiles=tuple(float(q) for q in np.quantile(pre, quantiles)),
    )
    errors, whole_errors = [], []
    for n_p in (3, 4, 5):
        run = simulate(w, SimConfig(profile, slo, n_p, 8 - n_p, mechanisms=MECHANISMS["static"]))
        measured = float(np.mean([r.ttft > slo.ttft for r in run.requests]))
        busy = model.prefill_busy(d, n_p)
        assert busy < 1.0
        errors.append(abs(model.queue_miss(d, busy, n_p) - measured))
        whole_errors.append(abs(whole.queue_miss(d, busy, n_p) - measured))
    assert all(e < we for e, we in zip(errors, whole_errors, strict=True))
    assert sum(errors) < 0.5 * sum(whole_errors)
