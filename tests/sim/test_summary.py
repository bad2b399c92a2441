"""The FluidPD-vs-baselines summary over results.json records."""

from __future__ import annotations

from fluidpd.sim.summary import format_summary, summarize


def rec(policy: str, rps: float, slo: float, tpot: float = 1.0, failed: int = 0) -> dict:
    return {
        "policy": policy, "rps": rps, "workload": "w", "slo_attainment": slo,
        "tpot_attainment": tpot, "failed": failed,
    }  # fmt: skip


def test_summary_picks_the_claims() -> None:
    runs = [
        rec("static", 10, 0.95), rec("fluidpd", 10, 0.97, tpot=0.99), rec("oracle", 10, 0.98),
        rec("static", 20, 0.30, failed=5), rec("fluidpd", 20, 0.90), rec("oracle", 20, 0.92),
        rec("static", 30, 0.10, failed=50), rec("fluidpd", 30, 0.50), rec("oracle", 30, 0.60),
    ]  # fmt: skip
    (s,) = summarize(runs)
    assert [r for r, _, _ in s.near_oracle] == [10, 20]
    assert s.worst_oracle_gap_pp is not None and abs(s.worst_oracle_gap_pp - 2.0) < 1e-9
    # Largest oracle - static gap is at 20 req/s (0.62), not 30 (0.50).
    assert s.mismatch_rps == 20 and s.gain_pp is not None and abs(s.gain_pp - 60.0) < 1e-9
    # TPOT compared only where static fails nothing.
    assert s.tpot_deltas == [(10, -0.010000000000000009)]
    text = format_summary([s])
    assert "most mismatched static rate 20 req/s" in text and "worst drop 1.0 pp" in text


def test_summary_leads_with_the_worst_rate_and_counts_cut_prompts() -> None:
    runs = [
        rec("static", 1, 0.56), rec("fluidpd", 1, 0.70),
        rec("static", 2, 0.37), rec("fluidpd", 2, 0.04),
        rec("static", 2.5, 0.21), rec("fluidpd", 2.5, 0.20),
    ]  # fmt: skip
    for r in runs:
        r["capped_prompts"] = 10
    (s,) = summarize(runs)
    assert s.worst_vs_static is not None
    rps, pp = s.worst_vs_static
    assert rps == 2 and abs(pp + 33.0) < 1e-9
    lines = format_summary([s]).splitlines()
    assert lines[1].startswith("  worst FluidPD - static over all rates: -33.0 pp at 2 req/s")
    assert "10 prompts cut to the context limit" in lines[2]
