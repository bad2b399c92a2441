"""Prints the predictive rule's D->P forecasts of one `fluidpd sim` run (issue #14, the two
oracle-2pp cells): ``python why.py sim ARGS...`` (the `fluidpd sim` arguments) writes one line
per forecast every 10 s and at every forecast that clearly wins, to stderr.

Each line is followed by the donor check taken apart: ``scale`` is the decode calibration
(observed / modelled decode ratio of the current split; 1 before the pool is calibrated),
``model_now`` the modelled decode ratio of the current split at the window's rate, and the
modelled decode ratio of the split after the switch (uncalibrated) at the window's rate
(``after@rate``) and at the rate the donor is checked at (``after@bound``: the higher of the
rate's upper bound, ``RATE_Z`` compound-Poisson standard errors, and the recent peak).

With ``WHY_SOURCE=prefill`` in the environment it prints the P->D forecasts instead (every
10 s, the first line only)."""

from __future__ import annotations

import os
import sys

import fluidpd.core.fluidrole as fr
from fluidpd.cli.main import main
from fluidpd.core.policy_forecast import (
    Demand,
    Forecast,
    Split,
    clearly_worth,
    decode_scale,
    prefill_scale,
)
from fluidpd.core.types import Role

_forecast = fr.FluidRolePolicy._forecast
SOURCE = Role(os.environ.get("WHY_SOURCE", "decode"))


def logged(
    self: fr.FluidRolePolicy, now: float, p: fr.PoolPressure, demand: Demand, source: Role
) -> Forecast:
    f = _forecast(self, now, p, demand, source)
    ok = clearly_worth(f, self.cfg.gain_margin)
    if source is SOURCE and (int(now) % 10 == 0 or ok):
        busy = "-" if p.prefill_busy is None else f"{p.prefill_busy:.2f}"
        print(
            f"t={now:6.0f} split={p.n_prefill}P{p.n_decode}D ppi={p.ppi_bar:7.2f} busy={busy}"
            f" dpi_load={p.dpi_load_bar:.2f} dpi_adm={p.dpi_adm_bar:.2f} rate={demand.rate:.2f}"
            f" peak={demand.peak_rate:.2f} n={demand.samples} loss {f.loss_before:.3f}->"
            f"{f.loss_after:.3f} saved={f.saved:.1f} noise={f.noise:.1f}"
            f" donor_after={f.donor_after:.2f} clearly_worth={ok}",
            file=sys.stderr,
        )
        if source is Role.PREFILL:
            return f
        m = self.model
        assert m is not None
        split = Split(p.n_prefill, p.n_decode)
        left = split.after(source)
        ps = prefill_scale(
            m.prefill_ratio(demand, split.n_prefill),
            p.ppi_bar,
            p.prefill_busy,
            m.prefill_busy(demand, split.n_prefill),
        )
        now_ratio = m.decode_ratio(
            demand, split.n_decode, m.prefill_wait(demand, split.n_prefill, ps)
        )
        observed = max(p.dpi_load_bar, p.dpi_adm_bar)
        bound = demand.burst
        at_rate = m.decode_ratio(demand, left.n_decode, m.prefill_wait(demand, left.n_prefill, ps))
        # The donor is checked by the streams and KV the demand asks for (``decode_demand_ratio``).
        queued = m.prefill_wait(bound, left.n_prefill, ps)
        at_bound = m.decode_demand_ratio(bound, left.n_decode, queued)
        print(
            f"        observed={observed:.2f} model_now={now_ratio:.2f}"
            f" scale_if_calibrated={decode_scale(now_ratio, observed):.2f}"
            f" after@rate={at_rate:.2f} bound_rate={bound.rate:.2f}"
            f" (+{100 * (bound.rate / demand.rate - 1):.0f} %) after@bound={at_bound:.2f}",
            file=sys.stderr,
        )
    return f


fr.FluidRolePolicy._forecast = logged  # type: ignore[method-assign]
sys.argv = ["fluidpd", *sys.argv[1:]]
main()
