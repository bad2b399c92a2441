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
