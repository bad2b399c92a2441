"""Experiment: a request that finds decode KV full misses only if it waits past its slack
(M/M/c: P(W > t | W > 0) = exp(-(c - a) mu t), mu = lambda / a by Little's law)."""
import math, os
from fluidpd.core import policy_forecast as pf

MODE = os.environ.get("KVW_MODE", "slack")

def decode_miss(self, d, n_decode, scale=1.0, queued_s=0.0):
    if d.rate <= 0:
        return 0.0
    if n_decode <= 0:
        return 1.0
    load = self.decode_load(d, n_decode, queued_s)
    held = scale * load.held
    kv = pf.poisson_tail(held, load.slots)
    if kv > 0 and math.isfinite(held) and held < load.slots:
        lam = d.rate / n_decode
        slack = max(0.0, self.slo.ttft - d.prefill_s)
        rate = (load.slots - held) * lam / held
        if os.environ.get("KVW_CS"):
            cs2 = max(0.0, d.output2 / d.output**2 - 1.0) if d.output > 0 and d.output2 > 0 else 1.0
            rate *= 2.0 / (1.0 + cs2)
        kv *= math.exp(-rate * slack)
    return max(pf.poisson_tail(scale * load.concurrency, load.n_tpot), kv)

pf.CapacityModel.decode_miss = decode_miss
