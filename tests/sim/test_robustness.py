"""The robustness suite at a reduced size (the committed run is results/robustness/)."""

from __future__ import annotations

from dataclasses import replace

from fluidpd.sim.robustness import (
    SIZES,
    cells,
    check,
    count_cells,
    format_overall,
    format_rows,
    max_switches_per,
    overall,
    quick_reversals,
    run_suite,
)


def test_one_factor_matrix_covers_every_dimension() -> None:
    size = SIZES["standard"]
    got = list(cells(size))
    assert {c.profile for c in got} == set(size.profiles)
    assert {c.slo for c in got} == set(size.slos)
    assert {c.workers for c in got} == set(size.workers)
    assert {c.workload for c in got} == set(size.workloads)
    assert {c.fraction for c in got} == set(size.fractions)
    base = [c for c in got if (c.profile, c.slo, c.workers) == (size.profiles[0], "medium", 4)]
    assert len(base) == len(size.workloads) * len(size.fractions)
    assert count_cells(SIZES["full"]) == 8 * 4 * 3 * 2 * 3


def test_reduced_suite_runs_and_is_reproducible() -> None:
    size = replace(
        SIZES["ci"],
        long_requests=150,
        workloads=("long-chat-poisson",),
        profiles=SIZES["ci"].profiles[:1],
        fractions=(1.2,),
    )
    rows = run_suite(size, seed=3)
    assert rows == run_suite(size, seed=3)
    (row,) = rows
    assert row["requests"] == 150 and row["workload"] == "long-chat-poisson"
    assert 0 <= row["static"] <= 1 and 0 <= row["fluidpd"] <= 1
    # The oracle is the best static split in hindsight, so it is never below the static one.
    assert row["oracle"] >= row["static"]
    assert row["max_switches_10min"] <= 2  # the switch budget
    summary = overall(rows)
    assert summary["cells"] == 1 and summary["worst_vs_static_pp"] == row["vs_static_pp"]


def test_a_cell_no_split_can_serve_is_skipped_not_compared() -> None:
    """Qwen3-14B on an A100 needs 1.1 s for an 8K-token prefill: with a 1 s TTFT target no
    split carries any rate of 8K-token chats. The cell is reported as skipped (the full matrix
    used to stop at it with "rps must be > 0") and the bars are taken over the others."""
    size = replace(
        SIZES["ci"],
        long_requests=120,
        workloads=("long-chat-poisson",),
        profiles=(("qwen3-14b", "a100-80gb"), ("llama-3.1-8b", "h200")),
        slos=("strict",),
        fractions=(0.6,),
    )
    skipped, ran = run_suite(size, seed=1)
    assert skipped["model"] == "qwen3-14b" and "TTFT 1 s" in skipped["skipped"]
    assert check(skipped) == [] and "rps" not in skipped
    assert ran["requests"] == 120 and "skipped" not in ran
    summary = overall([skipped, ran])
    assert summary["cells"] == 1 and summary["cells_skipped"] == 1
    assert summary["mean_vs_static_pp"] == ran["vs_static_pp"]
    assert "skipped: no static split meets TTFT 1 s" in format_rows([skipped, ran])
    assert "(and 1 skipped)" in format_overall(summary)


def test_bars_are_checked() -> None:
    row = {
        "static": 0.5, "fluidpd": 0.48, "oracle": 0.95, "vs_static_pp": -2.0,
        "vs_oracle_pp": -47.0, "max_switches_10min": 3, "quick_reversals": 1,
    }  # fmt: skip
    assert check(row) == ["static-1pp", "oracle-2pp", "half-gain", "flap", "reversal"]
    ok = dict(row, fluidpd=0.94, vs_static_pp=44.0, vs_oracle_pp=-1.0)
    ok.update(max_switches_10min=2, quick_reversals=0)
    assert check(ok) == []


def test_flap_counters() -> None:
    sw = [
        {"t": 0.0, "from": "decode", "to": "prefill"},
        {"t": 100.0, "from": "prefill", "to": "decode"},
        {"t": 700.0, "from": "decode", "to": "prefill"},
    ]
    assert max_switches_per(sw, 600.0) == 2
    assert quick_reversals(sw, 300.0) == 1
