"""The robustness suite at a reduced size (the committed run is results/robustness/)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fluidpd.profiles import resolve_profile
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.robustness import (
    SIZES,
    Cell,
    cell_timeseries,
    cells,
    check,
    count_cells,
    format_overall,
    format_rows,
    max_switches_per,
    named_profile,
    on_profile_files,
    overall,
    quick_reversals,
    run_cell,
    run_suite,
    setup_cell,
)
from fluidpd.sim.simulator import RoleSwitch, simulate


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


def test_a_cell_may_name_a_profile_file_in_place_of_a_shipped_profile() -> None:
    path = str(Path(__file__).parents[2] / "fluidpd/shipped_profiles/llama-3.2-1b-h200.yaml")
    size = on_profile_files(SIZES["ci"], [path])
    assert size.profiles == (("file:" + path, "file"),)
    cell = next(cells(size))
    assert named_profile(*cell.profile) == resolve_profile("llama-3.2-1b", "h200", None)
    shipped_qwen = resolve_profile("qwen3-14b", "a100-80gb", None)
    assert named_profile("qwen3-14b", "a100-80gb") == shipped_qwen
    # The suite sets the cell up on the file's profile, as it would on the shipped one.
    by_file = setup_cell(cell, 0, size)
    shipped = setup_cell(replace(cell, profile=("llama-3.2-1b", "h200")), 0, size)
    assert by_file is not None and shipped is not None and by_file.rps == shipped.rps


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


def test_a_cells_time_series_adds_up_to_its_row() -> None:
    """``cell_timeseries`` (the "show why" of a cell) is the cell ``run_cell`` scores: FluidPD's
    and the even static split's attainment and misses per bin match its row, on the profile
    given as well as the shipped one."""
    size = replace(SIZES["ci"], long_requests=150)
    cell = Cell("long-chat-poisson", ("llama-3.1-8b", "a100-80gb"), "medium", 4, 1.2)
    other = resolve_profile("llama-3.1-8b", "h200", None)
    for profile in (None, other):
        row = run_cell(cell, 0, size, profile)
        lines = cell_timeseries(cell, 0, size, 20.0, profile).splitlines()
        assert lines[0].endswith(f"{row['rps']:g} req/s")
        arrivals = [int(x) for x in lines[1].split()[1:]]
        assert sum(arrivals) == row["requests"]
        series = {ln.split("%")[0].rsplit(None, 1)[0].strip(): ln for ln in lines[2:] if "%" in ln}
        assert set(series) == {"static 1P3D", "static 2P2D", "static 3P1D", "fluidpd"}
        for label, key in (("static 2P2D", "static"), ("fluidpd", "fluidpd")):
            share, misses = series[label].split("%")
            assert float(share.split()[-1]) == round(100 * row[key], 1)
            assert sum(int(x) for x in misses.split()) == round((1 - row[key]) * row["requests"])
        assert sum("switch {" in ln for ln in lines) == row["switches"]


def _first_switch_and_gain(cell: Cell, seed: int) -> tuple[RoleSwitch, float]:
    """FluidPD's first switch in ``cell`` and its attainment less static's."""
    setup = setup_cell(cell, seed, SIZES["full"])
    assert setup is not None
    runs = {
        name: simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS[name]))
        for name in ("static", "fluidpd")
    }
    static, fluid = (attainment(runs[n].requests, setup.base.slo) for n in ("static", "fluidpd"))
    return runs["fluidpd"].switches[0], fluid - static


def test_a_gain_the_rates_lower_bound_cannot_see_is_taken_early() -> None:
    """Long generations of long prompts on 2P2D, where 1P3D serves nearly every request: with
    few arrivals of widely spread outputs the rate's lower bound shows neither split missing
    anything, and counted there alone the P->D switch came after 12 minutes of a saturated
    decode pool. The gain at the window's rate takes it within the first two minutes."""
    cell = Cell("long-long-poisson", ("qwen3-30b-a3b", "a100-80gb"), "medium", 4, 0.6)
    switch, gain = _first_switch_and_gain(cell, 0)
    assert (switch.source, switch.target) == ("prefill", "decode") and switch.t < 120.0
    assert gain > 0.3


def test_a_split_past_capacity_in_its_receiver_alone_is_traded_early() -> None:
    """Long generations of long prompts in bursts on 2P2D, both splits past capacity: 1P3D
    only in its decode pool, which the switch relieves, so the trade flips nothing. Asking
    the whole split after the switch to be within capacity held the P->D switch back until
    453 s of the 726 s trace (static 16.4 %, FluidPD 22.9 %)."""
    cell = Cell("long-long-bursty", ("qwen3-30b-a3b", "a100-80gb"), "medium", 4, 0.9)
    switch, gain = _first_switch_and_gain(cell, 1)
    assert (switch.source, switch.target) == ("prefill", "decode") and switch.t < 120.0
    assert gain > 0.15


def test_the_last_switch_of_the_budget_holds_at_the_rate_past_its_bound() -> None:
    """8.8K-token chats on 8 workers: after a D->P switch to 5P3D (the best split), a second
    one to 6P2D read its two decode workers within capacity at the rate's bound, which the
    trace then passed for 80 s; 6P2D missed TTFT for up to 65 % of the requests. As the
    budget's last switch it must not lose at the bound raised by the margin, where 5P3D
    still serves: FluidPD stays at 5P3D."""
    cell = Cell("long-chat-poisson", ("llama-3.1-8b", "a100-80gb"), "medium", 8, 0.9)
    setup = setup_cell(cell, 0, SIZES["full"])
    assert setup is not None
    run = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    assert [(s.source, s.target) for s in run.switches] == [("decode", "prefill")]
    best = simulate(
        setup.workload,
        replace(setup.base, mechanisms=MECHANISMS["static"], n_prefill=5, n_decode=3),
    )
    fluid, five = (attainment(r.requests, setup.base.slo) for r in (run, best))
    assert fluid >= five - 0.02


def test_a_switch_an_undo_could_follow_holds_at_the_rate_past_its_bound_too() -> None:
    """8.5K-token chats on 2P2D, 37 arrivals in: 3P1D read its lone decode worker within
    capacity at the rate's upper bound, but losing most requests at the bound raised by the
    margin, where 2P2D still serves. Taken, the worker's KV filled at 120 s and stayed full
    until the undo at 191 s (static 89.4 %, FluidPD 88.1 %). The undo the budget still
    allowed does not make the bet safe: FluidPD keeps 2P2D through the trace's load."""
    cell = Cell("long-chat-poisson", ("llama-3.1-8b", "a100-80gb"), "relaxed", 4, 0.9)
    setup = setup_cell(cell, 1, SIZES["full"])
    assert setup is not None
    run = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    end = max(r.arrival for r in run.requests)
    assert all(s.t > end - 30.0 for s in run.switches)
    static = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["static"]))
    fluid, kept = (attainment(r.requests, setup.base.slo) for r in (run, static))
    assert fluid >= kept - 0.01


def test_a_prefill_donor_that_fails_only_at_a_peak_the_split_kept_fails_too_is_given() -> None:
    """8.8K-token chats on Qwen3-30B-A3B/A100, 3 s TTFT, 2P2D, its decode pool full: 1P3D's
    one prefill worker is within capacity at the window's rate (0.87) and past it at the
    rate's upper bound (1.07), where 2P2D's decode pool is further past its own (1.61).
    Refused, FluidPD kept 2P2D (63.9 %, the static split's figure); taken at 115 s
    (``overload_shared``), 1P3D served 91.5 %."""
    cell = Cell("long-chat-poisson", ("qwen3-30b-a3b", "a100-80gb"), "relaxed", 4, 0.9)
    setup = setup_cell(cell, 0, SIZES["full"])
    assert setup is not None
    run = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    assert [(s.source, s.target) for s in run.switches] == [("prefill", "decode")]
    static = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["static"]))
    fluid, kept = (attainment(r.requests, setup.base.slo) for r in (run, static))
    assert fluid >= kept + 0.2


def test_a_burst_that_began_inside_the_current_bin_is_read_at_its_rate() -> None:
    """Bursts of long generations of long prompts on 8B/A100, 8 workers, 1 s TTFT: arrivals
    went from 0.6 to 2.9 req/s at 190 s, and the D->P switch at 208 s checked its decode
    donor at 1.52 req/s (completed bins and the window's bound), where the last 10-30 s ran
    at 2.4. The decode pool it left saturated in the burst (static 71.2 %, FluidPD 69.2 %).
    Read with the current bin's trailing thirds, the donor does not carry the burst, and
    FluidPD keeps the static split's attainment."""
    cell = Cell("long-long-bursty", ("llama-3.1-8b", "a100-80gb"), "strict", 8, 0.6)
    setup = setup_cell(cell, 2, SIZES["full"])
    assert setup is not None
    run = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    static = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["static"]))
    fluid, kept = (attainment(r.requests, setup.base.slo) for r in (run, static))
    assert fluid >= kept - 0.01
