"""Compares FluidPD with the baselines in a results.json: the claims the paper makes.

Per workload, first the worst FluidPD - static over every rate (a controller that loses at one
rate must say so before it reports a gain at another) and how many prompts were cut to the
context limit; then, at every rate where the oracle reaches 90 %, FluidPD's distance to it; at the
rate where the static split is most mismatched (largest oracle - static gap), FluidPD's gain
over static; and, at rates where static fails no request (below saturation), the TPOT
attainment difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    workload: str
    near_oracle: list[tuple[float, float, float]]  # (rps, fluidpd, oracle) where oracle >= 0.9
    mismatch_rps: float | None
    mismatch_static: float | None
    mismatch_fluidpd: float | None
    tpot_deltas: list[tuple[float, float]]  # (rps, fluidpd - static TPOT attainment)
    has_oracle: bool = True
    #: (rps, fluidpd - static attainment) at every rate with both.
    deltas: tuple[tuple[float, float], ...] = ()
    #: Prompts cut to the context limit (per run of this workload; the same at every rate).
    capped_prompts: int = 0

    @property
    def worst_vs_static(self) -> tuple[float, float] | None:
        """(rps, pp) of the lowest FluidPD - static over all rates."""
        if not self.deltas:
            return None
        rps, d = min(self.deltas, key=lambda x: (x[1], x[0]))
        return rps, 100 * d

    @property
    def worst_oracle_gap_pp(self) -> float | None:
        gaps = [100 * (o - f) for _, f, o in self.near_oracle]
        return max(gaps) if gaps else None

    @property
    def gain_pp(self) -> float | None:
        if self.mismatch_static is None or self.mismatch_fluidpd is None:
            return None
        return 100 * (self.mismatch_fluidpd - self.mismatch_static)

    @property
    def worst_tpot_drop_pp(self) -> float | None:
        return max((-100 * d for _, d in self.tpot_deltas), default=None)


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[WorkloadSummary]:
    by: dict[str, dict[float, dict[str, Mapping[str, Any]]]] = {}
    for r in runs:
        by.setdefault(str(r["workload"]), {}).setdefault(float(r["rps"]), {})[r["policy"]] = r
    out = []
    for workload, rates in sorted(by.items()):
        near: list[tuple[float, float, float]] = []
        deltas: list[tuple[float, float]] = []
        capped = max(
            (int(p.get("capped_prompts", 0)) for q in rates.values() for p in q.values()), default=0
        )
        tpot: list[tuple[float, float]] = []
        mismatch: tuple[float, float, float, float] | None = None  # gap, rps, static, fluidpd
        for rps, pol in sorted(rates.items()):
            fpd, orc, sta = pol.get("fluidpd"), pol.get("oracle"), pol.get("static")
            if fpd and orc and orc["slo_attainment"] >= 0.9:
                near.append((rps, fpd["slo_attainment"], orc["slo_attainment"]))
            if fpd and sta and sta["failed"] == 0:
                tpot.append((rps, fpd["tpot_attainment"] - sta["tpot_attainment"]))
            if fpd and sta:
                deltas.append((rps, fpd["slo_attainment"] - sta["slo_attainment"]))
                best = orc["slo_attainment"] if orc else fpd["slo_attainment"]
                gap = best - sta["slo_attainment"]
                if mismatch is None or gap > mismatch[0]:
                    mismatch = (gap, rps, sta["slo_attainment"], fpd["slo_attainment"])
        out.append(
            WorkloadSummary(
                workload,
                near,
                mismatch[1] if mismatch else None,
                mismatch[2] if mismatch else None,
                mismatch[3] if mismatch else None,
                tpot,
                any("oracle" in pol for pol in rates.values()),
                tuple(deltas),
                capped,
            )
        )
    return out


def format_summary(summaries: Sequence[WorkloadSummary]) -> str:
    lines = []
    for s in summaries:
        lines.append(f"{s.workload}:")
        worst = s.worst_vs_static
        if worst is not None:
            others = ", ".join(f"{r:g}: {100 * d:+.1f}" for r, d in s.deltas)
            lines.append(
                f"  worst FluidPD - static over all rates: {worst[1]:+.1f} pp at {worst[0]:g}"
                f" req/s (per rate, pp: {others})"
            )
        if s.capped_prompts:
            lines.append(f"  {s.capped_prompts} prompts cut to the context limit in each run")
        for rps, f, o in s.near_oracle:
            lines.append(
                f"  {rps:g} req/s: FluidPD {100 * f:.1f} % vs oracle {100 * o:.1f} % "
                f"({100 * (f - o):+.1f} pp)"
            )
        if s.has_oracle and not s.near_oracle:
            lines.append("  the oracle reaches 90 % at no rate")
        if s.gain_pp is not None:
            static, fluidpd = 100 * (s.mismatch_static or 0), 100 * (s.mismatch_fluidpd or 0)
            what = "most mismatched static rate" if s.has_oracle else "best FluidPD - static at"
            lines.append(
                f"  {what} {s.mismatch_rps:g} req/s: static {static:.1f} %,"
                f" FluidPD {fluidpd:.1f} % ({s.gain_pp:+.1f} pp)"
            )
        if s.worst_tpot_drop_pp is not None:
            rates = ", ".join(f"{r:g}" for r, _ in s.tpot_deltas)
            lines.append(
                f"  TPOT attainment, FluidPD vs static where static fails nothing ({rates} req/s):"
                f" worst drop {max(0.0, s.worst_tpot_drop_pp):.1f} pp"
            )
    return "\n".join(lines)
