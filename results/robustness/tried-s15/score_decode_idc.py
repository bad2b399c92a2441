"""One-off: model-accuracy's ranking with the decode pool's Poisson occupancy tail widened by
the arrival counts' index of dispersion (variance = mean x IDC at DECODE_BIN s; "none": 1),
and the prefill queue's c_a^2 read as the index at PREFILL_BIN s ("none": c_a^2).

    python tried-s15/score_decode_idc.py PREFILL_BIN DECODE_BIN    # from results/robustness/
"""
import sys, math, json
from dataclasses import replace
sys.path.insert(0, "model-accuracy")
import accuracy
from fluidpd.core import policy_forecast as pf
PB, DB = sys.argv[1], sys.argv[2]
def tail(mean, limit, f):
    if mean <= 0: return 0.0
    if not math.isfinite(mean) or limit <= 0: return 1.0
    return 0.5 * math.erfc((limit + 0.5 - mean) / math.sqrt(2.0 * mean * f))
cur = {"f": 1.0}
def decode_miss(self, d, n_decode, scale=1.0, queued_s=0.0):
    if d.rate <= 0: return 0.0
    if n_decode <= 0: return 1.0
    load = self.decode_load(d, n_decode, queued_s)
    f = cur["f"]
    return max(tail(scale * load.concurrency, load.n_tpot, f), tail(scale * load.held, load.slots, f))
pf.CapacityModel.decode_miss = decode_miss
base_demand = accuracy._demand
def dem(row, idc_bin=None):
    cur["f"] = max(1.0, row["idc"][DB]) if DB != "none" else 1.0
    return base_demand(row, None if PB == "none" else PB)
accuracy._demand = dem
rows = [json.loads(l) for l in open("model-accuracy/seed0.jsonl")]
long = [r for r in rows if r["trace_s"] >= 120]
print(PB, DB, accuracy.score(rows, 0, "every")[0]); print(PB, DB, accuracy.score(long, 0, "long")[0])
