"""Experiment: a switch cannot save more requests than the split kept is observed to miss.
Imported for its effect."""
import bisect, math, os
from fluidpd.core import fluidrole
from fluidpd.sim import simulator as simmod

Z = float(os.environ.get("OBS_Z", "2"))
RECENT = float(os.environ.get("OBS_RECENT", "10"))
MODE = os.environ.get("OBS_MODE", "away")
OBS = {}
REFUSED = [0]
Sim = next(v for k, v in vars(simmod).items() if isinstance(v, type) and hasattr(v, "_control"))
orig_control = Sim._control


def _count(self, lo, hi):
    arr = self.workload.arrivals
    i = bisect.bisect_left(arr, lo); j = bisect.bisect_right(arr, hi)
    ttft = self.cfg.slo.ttft
    missed = 0
    for r in self.requests[i:j]:
        ft = r.first_token_t
        if r.failed or math.isnan(ft) or ft - r.arrival > ttft:
            missed += 1
    return j - i, missed


def _control(self):
    pol = self.role_policy
    now = self.now
    lo = max(now - 60.0, pol._last_switch_end, float(self.workload.arrivals[0]))
    hi = now - self.cfg.slo.ttft
    OBS[id(pol)] = None
    if hi > lo:
        OBS[id(pol)] = (_count(self, lo, hi), _count(self, max(lo, hi - RECENT), hi), self.cfg.n_prefill)
    orig_control(self)


Sim._control = _control
orig_worth = fluidrole.FluidRolePolicy._worth


def _ub(judged, missed, cv2):
    return (missed + Z * math.sqrt(max(missed, 1.0) * max(1.0, cv2))) / judged


def _worth(self, now, f, p, source, trade=True):
    basis = orig_worth(self, now, f, p, source, trade)
    if basis is None:
        return None
    obs = OBS.get(id(self))
    if obs is None:
        return basis
    (jw, mw), (jr, mr), home = obs
    toward = (p.n_prefill > home) if source is fluidrole.Role.PREFILL else (p.n_prefill < home)
    if toward and MODE != "all":
        return basis
    if jw < 30 or f.before >= 1.0 or f.burst_before >= 1.0:
        return basis
    share = _ub(jw, mw, f.arrival_cv2)
    if jr >= 10:
        share = max(share, _ub(jr, mr, f.arrival_cv2))
    mean = f.at_mean
    saved = max(f.saved, mean.saved if mean is not None else 0.0)
    arrivals = max(f.arrivals, f.mean_arrivals)
    bound = min(1.0, share) * arrivals
    if saved > bound:
        REFUSED[0] += 1
        if os.environ.get("OBS_DEBUG"):
            print("refuse", round(now, 1), source, jw, mw, jr, mr, round(saved, 1), round(bound, 1))
        return None
    return basis


fluidrole.FluidRolePolicy._worth = _worth
