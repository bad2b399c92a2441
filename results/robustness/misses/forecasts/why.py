"""Prints the predictive rule's D->P forecasts of one `fluidpd sim` run (issue #14, the two
oracle-2pp cells): ``python why.py sim ARGS...`` (the `fluidpd sim` arguments) writes one line
per forecast every 10 s and at every forecast that clearly wins, to stderr."""

from __future__ import annotations

import sys

import fluidpd.core.fluidrole as fr
from fluidpd.cli.main import main
from fluidpd.core.policy_forecast import Demand, Forecast, clearly_worth
from fluidpd.core.types import Role

_forecast = fr.FluidRolePolicy._forecast


def logged(
    self: fr.FluidRolePolicy, now: float, p: fr.PoolPressure, demand: Demand, source: Role
) -> Forecast:
    f = _forecast(self, now, p, demand, source)
    ok = clearly_worth(f, self.cfg.gain_margin)
    if source is Role.DECODE and (int(now) % 10 == 0 or ok):
        busy = "-" if p.prefill_busy is None else f"{p.prefill_busy:.2f}"
        print(
            f"t={now:6.0f} split={p.n_prefill}P{p.n_decode}D ppi={p.ppi_bar:7.2f} busy={busy}"
            f" dpi_load={p.dpi_load_bar:.2f} dpi_adm={p.dpi_adm_bar:.2f} rate={demand.rate:.2f}"
            f" peak={demand.peak_rate:.2f} n={demand.samples} loss {f.loss_before:.3f}->"
            f"{f.loss_after:.3f} saved={f.saved:.1f} noise={f.noise:.1f}"
            f" donor_after={f.donor_after:.2f} clearly_worth={ok}",
            file=sys.stderr,
        )
    return f


fr.FluidRolePolicy._forecast = logged  # type: ignore[method-assign]
sys.argv = ["fluidpd", *sys.argv[1:]]
main()
