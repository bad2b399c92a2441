"""Experiment (simulator only): undo a switch away from the deployment's own split once the
requests that arrived after it miss TTFT beyond what its forecast said the new split would
miss, and beyond what the split kept was missing before it. Imported for its effect."""
import bisect, math, os
from fluidpd.core import fluidrole
from fluidpd.sim import simulator as simmod

Z = float(os.environ.get("UNDO_Z", "2"))
MIN_JUDGED = int(os.environ.get("UNDO_MIN", "30"))
STATE = {}
UNDONE = [0]
Sim = next(v for k, v in vars(simmod).items() if isinstance(v, type) and hasattr(v, "_control"))
orig_control = Sim._control
orig_commit = fluidrole.FluidRolePolicy._commit
CURRENT = {}


def _count(sim, lo, hi):
    arr = sim.workload.arrivals
    i = bisect.bisect_left(arr, lo); j = bisect.bisect_right(arr, hi)
    ttft = sim.cfg.slo.ttft
    missed = sum(1 for r in sim.requests[i:j]
                 if r.failed or math.isnan(r.first_token_t) or r.first_token_t - r.arrival > ttft)
    return j - i, missed


def _commit(self, now, workers, source, rec, pressure, forecast, demand, undo=False, shared=False):
    d = orig_commit(self, now, workers, source, rec, pressure, forecast, demand, undo=undo, shared=shared)
    sim = CURRENT.get(id(self))
    if d is None or sim is None:
        return d
    STATE.pop(id(self), None)
    home = sim.cfg.n_prefill
    away = (pressure.n_prefill <= home) if source is fluidrole.Role.PREFILL else (pressure.n_prefill >= home)
    if undo or forecast is None or not away:
        return d
    if os.environ.get("UNDO_WITHIN") and (forecast.before >= 1.0 or forecast.burst_before >= 1.0):
        return d
    after = forecast.mean_loss_after if forecast.mean_arrivals > 0 else forecast.loss_after
    lo = max(now - 60.0, self._last_switch_end, float(sim.workload.arrivals[0]))
    pre = _count(sim, lo, now - sim.cfg.slo.ttft) if now - sim.cfg.slo.ttft > lo else (0, 0)
    cv2 = max(1.0, forecast.arrival_cv2)
    STATE[id(self)] = dict(after=min(1.0, after), pre=pre, source=source, rec=rec, cv2=cv2)
    return d


def _ub(j, m, cv2):
    return (m + Z * math.sqrt(max(m, 1.0) * cv2)) / j if j else 1.0


def _control(self):
    pol = self.role_policy
    CURRENT[id(pol)] = self
    st = STATE.get(id(pol))
    now = self.now
    if st is not None and pol._switching is None and pol._undo_due is None and math.isfinite(pol._last_switch_end):
        hi = now - self.cfg.slo.ttft
        if hi > pol._last_switch_end:
            j, m = _count(self, pol._last_switch_end, hi)
            if j >= MIN_JUDGED:
                lb = (m - Z * math.sqrt(max(m, 1.0) * st["cv2"])) / j
                bound = max(st["after"], _ub(*st["pre"], st["cv2"]) if st["pre"][0] >= MIN_JUDGED else st["after"])
                if lb > bound and pol._budget_left(now):
                    pol._frozen_until[st["rec"]] = now + pol.cfg.freeze_s
                    pol._undo_due = fluidrole._Check(st["source"], st["rec"], now, pol._last_switch_end)
                    pol._watch = pol._check = None
                    STATE.pop(id(pol), None)
                    UNDONE[0] += 1
                    if os.environ.get("UNDO_DEBUG"):
                        print("undo", round(now, 1), j, m, round(lb, 3), round(bound, 3))
    orig_control(self)


Sim._control = _control
fluidrole.FluidRolePolicy._commit = _commit
