"""Tests for fluidpd.sim.plots: the Fig. 9a / 10 / 11 figures from synthetic results."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib
import numpy as np
import pytest

from fluidpd.sim import plots
from fluidpd.sim.plots import (
    POLICY_COLORS,
    plot_ablation,
    plot_attainment_vs_rps,
    plot_timeseries,
    write_plots,
)
from fluidpd.sim.policies import POLICY_NAMES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_POLICIES = ("static", "fluidtoken", "fluidrole", "fluidpd", "oracle", "autoscale")
QUALITY = {
    "static": 0.0,
    "autoscale": 0.05,
    "fluidtoken": 0.1,
    "fluidrole": 0.15,
    "fluidpd": 0.25,
    "oracle": 0.3,
}


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG after checking its signature and size on disk."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert 5_000 < len(data) < 5_000_000, f"{path}: implausible size {len(data)} B"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _assert_png(path: Path) -> None:
    width, height = _png_size(path)
    assert width >= 500 and height >= 400


def _record(workload: str, rps: float, policy: str, attainment: float | None) -> dict[str, Any]:
    return {
        "policy": policy,
        "rps": rps,
        "workload": workload,
        "model": "llama-3.1-8b",
        "gpu": "a100-80gb",
        "pd": "4P4D",
        "ttft_slo": 2.0,
        "tpot_slo": 0.1,
        "slo_attainment": attainment,
        "ttft_attainment": None if attainment is None else min(1.0, attainment + 0.02),
        "tpot_attainment": 0.99,
        "role_switches": [],
        "stolen_tokens": 0,
        "window_attainment": {"all": attainment},
    }


def _runs(
    policies: Sequence[str] = ALL_POLICIES,
    workloads: Sequence[str] = ("azure-mixed", "azure-staged"),
    rates: Sequence[float] = (10.0, 20.0, 30.0),
) -> list[dict[str, Any]]:
    runs = []
    for w in workloads:
        for rps in rates:
            base = max(0.0, 1.0 - (rps - 5.0) / 40.0)  # static: 0.875, 0.625, 0.375
            for p in policies:
                runs.append(_record(w, rps, p, min(1.0, base + QUALITY.get(p, 0.12))))
    return runs


def _series(policy: str, n: int = 300, dt: float = 1.0) -> dict[str, Any]:
    t = [round(i * dt, 3) for i in range(n)]
    burst = [1.0 if 100 <= x < 200 else 0.0 for x in t]
    adaptive = policy in {"fluidrole", "fluidpd"}
    stealing = policy in {"fluidtoken", "fluidpd"}
    n_prefill = [5 if adaptive and x >= 120 else 4 for x in t]
    bins = list(range(0, int(n * dt), 10))
    p95: list[float | None] = [
        None if b == 50 else (0.3 + (20.0 if 100 <= b < 200 and not adaptive else 0.0))
        for b in bins
    ]
    return {
        "t": t,
        "n_prefill": n_prefill,
        "n_decode": [8 - p for p in n_prefill],
        "prefill_queue": [int(40 * b) for b in burst],
        "stolen_tokens": [int(500 * b) if stealing else 0 for b in burst],
        "ppi_bar": [0.5 + b for b in burst],
        "dpi_load_bar": [0.3] * n,
        "dpi_adm_bar": [0.0] * n,
        "p95_ttft_t": [float(b) for b in bins],
        "p95_ttft": p95,
    }


def _series_map(
    runs_at: Sequence[tuple[str, float]], policies: Sequence[str]
) -> dict[tuple[str, float, str], dict[str, Any]]:
    out: dict[tuple[str, float, str], dict[str, Any]] = {}
    for workload, rps in runs_at:
        for p in policies:
            out[(workload, rps, p)] = {} if p == "oracle" else _series(p)
    return out


def test_backend_is_agg() -> None:
    assert matplotlib.get_backend().lower() == "agg"


def test_every_policy_has_a_distinct_colour() -> None:
    assert set(POLICY_NAMES) <= set(POLICY_COLORS)
    colours = [POLICY_COLORS[p] for p in POLICY_NAMES]
    assert len(set(colours)) == len(colours)


# -- Fig. 9a ----------------------------------------------------------------------------------
def test_attainment_vs_rps_writes_png(tmp_path: Path) -> None:
    path = plot_attainment_vs_rps(_runs(), tmp_path / "a.png", "TTFT ≤ 2 s, TPOT ≤ 100 ms")
    assert path == tmp_path / "a.png"
    _assert_png(path)


def test_attainment_vs_rps_with_ttft_lines_and_subdir(tmp_path: Path) -> None:
    path = plot_attainment_vs_rps(_runs(), tmp_path / "sub" / "a.png", show_ttft=True)
    _assert_png(path)


def test_attainment_vs_rps_missing_and_unknown_policies(tmp_path: Path) -> None:
    runs = _runs(policies=("fluidpd",), workloads=("azure-mixed",)) + _runs(
        policies=("mystery", "autoscale"), workloads=("azure-staged",), rates=(25.0,)
    )
    _assert_png(plot_attainment_vs_rps(runs, tmp_path / "a.png"))


def test_attainment_vs_rps_panels_split_by_varying_config(tmp_path: Path) -> None:
    runs = _runs(policies=("static", "fluidpd"), workloads=("azure-mixed",))
    other = [dict(r, pd="3P3D") for r in _runs(policies=("autoscale", "fluidpd"))]
    wide = _png_size(plot_attainment_vs_rps(runs + other, tmp_path / "three.png"))
    narrow = _png_size(plot_attainment_vs_rps(runs, tmp_path / "one.png"))
    assert wide[0] > narrow[0]  # three panels side by side vs one


def test_attainment_vs_rps_skips_bad_values(tmp_path: Path) -> None:
    runs = _runs(workloads=("azure-mixed",))
    runs.append(_record("azure-mixed", 40.0, "static", None))
    runs.append(_record("azure-mixed", 45.0, "static", math.nan))
    runs.append({"policy": "static", "workload": "azure-mixed"})  # no rps, no attainment
    _assert_png(plot_attainment_vs_rps(runs, tmp_path / "a.png"))


@pytest.mark.parametrize(
    "runs",
    [[], [_record("azure-mixed", 10.0, "static", None)], [{"policy": "static"}]],
)
def test_attainment_vs_rps_empty_writes_nothing(tmp_path: Path, runs: list[Any]) -> None:
    path = plot_attainment_vs_rps(runs, tmp_path / "a.png")
    assert path == tmp_path / "a.png"
    assert not path.exists()


# -- Fig. 10 ----------------------------------------------------------------------------------
def test_timeseries_writes_png(tmp_path: Path) -> None:
    series = {p: _series(p) for p in ("static", "fluidtoken", "fluidrole", "fluidpd")}
    path = plot_timeseries(
        series, tmp_path / "ts.png", "Azure (staged)", ttft_slo=2.0, window_edges=[100.0, 200.0]
    )
    width, height = _png_size(path)
    assert height > width  # four stacked panels


def test_timeseries_partial_and_odd_series(tmp_path: Path) -> None:
    long = _series("fluidpd", n=3000, dt=0.5)  # rebinned stolen tokens
    only_ttft = {k: v for k, v in _series("static").items() if k.startswith("p95")}
    no_ttft = {k: v for k, v in _series("fluidtoken").items() if not k.startswith("p95")}
    all_none = dict(_series("fluidrole"), p95_ttft=[None] * len(_series("fluidrole")["p95_ttft"]))
    ragged = _series("mystery")
    ragged["prefill_queue"] = ragged["prefill_queue"][:10]
    series = {
        "fluidpd": long,
        "static": only_ttft,
        "fluidtoken": no_ttft,
        "fluidrole": all_none,
        "mystery": ragged,
        "oracle": {},
    }
    _assert_png(plot_timeseries(series, tmp_path / "ts.png", "odd"))


def test_timeseries_varying_worker_count(tmp_path: Path) -> None:
    s = _series("autoscale")
    s["n_decode"] = [4 if x < 150 else 5 for x in s["t"]]  # scale-out: no fixed total
    _assert_png(plot_timeseries({"autoscale": s}, tmp_path / "ts.png", "autoscale", ttft_slo=2.0))


def test_timeseries_nothing_stolen_and_no_positive_ttft(tmp_path: Path) -> None:
    s = _series("static")
    s["p95_ttft"] = [0.0 for _ in s["p95_ttft"]]
    _assert_png(plot_timeseries({"static": s}, tmp_path / "ts.png", "static", ttft_slo=2.0))


@pytest.mark.parametrize("series", [{}, {"oracle": {}}, {"static": {"t": [], "n_prefill": []}}])
def test_timeseries_empty_writes_nothing(tmp_path: Path, series: dict[str, Any]) -> None:
    path = plot_timeseries(series, tmp_path / "ts.png", "empty", ttft_slo=2.0)
    assert not path.exists()


# -- Fig. 11 ----------------------------------------------------------------------------------
def test_ablation_writes_png(tmp_path: Path) -> None:
    _assert_png(plot_ablation(_runs(), tmp_path / "ab.png"))


def test_ablation_with_requested_rates(tmp_path: Path) -> None:
    path = plot_ablation(_runs(), tmp_path / "ab.png", {"azure-mixed": 20.0, "azure-staged": 31.0})
    _assert_png(path)


def test_ablation_needs_every_component(tmp_path: Path) -> None:
    """Two bars are no ablation: a workload shows up only with static, FluidToken-only,
    FluidRole-only and FluidPD at the rate shown."""
    partial = _runs(policies=("static", "fluidpd"), workloads=("azure-mixed",)) + _runs(
        policies=("fluidrole", "autoscale"), workloads=("azure-staged",), rates=(30.0,)
    )
    assert not plot_ablation(partial, tmp_path / "none.png").exists()
    complete = _runs(policies=plots.ABLATION_COMPONENTS, workloads=("azure-staged",))
    fig = plots._ablation_figure(partial + complete, None)
    assert fig is not None
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Azure (staged)\n30 req/s"]
    _assert_png(plot_ablation(partial + complete, tmp_path / "ab.png"))


@pytest.mark.parametrize("runs", [[], _runs(policies=("autoscale", "mystery"))])
def test_ablation_empty_writes_nothing(tmp_path: Path, runs: list[Any]) -> None:
    path = plot_ablation(runs, tmp_path / "ab.png")
    assert not path.exists()


def _cells(static: Sequence[float], rates: Sequence[float]) -> dict[tuple[str, float], float]:
    cells = {("static", r): s for r, s in zip(rates, static, strict=True)}
    cells.update({("fluidpd", r): 1.0 for r in rates})
    return cells


def test_pick_rps_rules() -> None:
    pick = plots._pick_rps
    rates = (10.0, 20.0, 30.0)
    assert pick("w", {("static", 25.0): 0.5}, {"w": 10.0}) == 25.0  # the only rate
    assert pick("w", _cells((1, 0.5, 0.2), rates), {"w": 19.0}) == 20.0  # requested (nearest)
    assert pick("w", _cells((1, 0.5, 0.2), rates), {"other": 10.0}) == 30.0
    assert pick("w", _cells((1, 0.95, 0.85), rates), None) == 30.0
    assert pick("w", _cells((0.95, 0.85, 0.95), rates), None) == 20.0  # static < 90 %
    assert pick("w", _cells((1, 0.95, 0.92), rates), None) == 30.0  # never below: highest
    # Prefer a rate that every policy of the workload ran at.
    cells = _cells((0.5, 0.5, 0.5), rates)
    cells[("fluidrole", 10.0)] = 0.7
    cells[("fluidrole", 20.0)] = 0.8
    assert pick("w", cells, None) == 20.0


# -- write_plots ------------------------------------------------------------------------------
def test_write_plots_names(tmp_path: Path) -> None:
    runs = _runs(rates=(20.0, 30.0, 35.0))
    series = _series_map([("azure-staged", 30.0), ("azure-mixed", 35.0)], ALL_POLICIES)
    out = tmp_path / "out"
    written = write_plots(out, runs, series, 2.0, {"azure-staged": [100.0, 200.0]})
    assert {p.name for p in written} == {
        "attainment_vs_rps.png",
        "ablation.png",
        "timeseries_azure-staged_30.png",
        "timeseries_azure-mixed_35.png",
    }
    for p in written:
        assert p.parent == out
        _assert_png(p)
    assert sorted(out.iterdir()) == sorted(written)


def test_write_plots_fractional_rate_and_csv_workload(tmp_path: Path) -> None:
    workload = "/data/traces/my trace.csv"
    runs = _runs(policies=("static", "fluidpd"), workloads=(workload,), rates=(2.5,))
    series = _series_map([(workload, 2.5)], ("static", "fluidpd"))
    written = write_plots(tmp_path, runs, series, 2.0)
    assert "timeseries_my-trace_2.5.png" in {p.name for p in written}


def test_write_plots_missing_policies(tmp_path: Path) -> None:
    runs = _runs(policies=("fluidpd",), workloads=("azure-mixed",), rates=(20.0,))
    series = _series_map([("azure-mixed", 20.0)], ("fluidpd", "oracle"))
    written = write_plots(tmp_path, runs, series, 2.0, {})
    assert {p.name for p in written} == {"attainment_vs_rps.png", "timeseries_azure-mixed_20.png"}


def test_write_plots_only_autoscale_skips_ablation(tmp_path: Path) -> None:
    runs = _runs(policies=("autoscale",))
    assert [p.name for p in write_plots(tmp_path, runs, {}, 2.0)] == ["attainment_vs_rps.png"]


def test_write_plots_empty_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert write_plots(out, [], {}, 2.0) == []
    assert write_plots(out, [], {("azure-mixed", 20.0, "oracle"): {}}, 2.0, None) == []
    assert not out.exists()


def test_window_edges() -> None:
    workload = SimpleNamespace(
        arrivals=np.array([0.0, 1.0, 2.5, 4.0, 7.0]),
        windows=(("conv-1", 0, 2), ("code", 2, 4), ("conv-2", 4, 5), ("empty", 5, 5)),
    )
    assert plots.window_edges(workload) == [2.5, 7.0]


# -- titles: what the figure shows, never cut off ---------------------------------------------
def _live(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r, endpoint="http://127.0.0.1:8000") for r in runs]


def _title_fits(fig: Any) -> str:
    """The figure's title after drawing, checked to lie inside the figure."""
    fig.canvas.draw()
    title = fig.get_suptitle()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, title
    return " ".join(title.split())


def test_source_label() -> None:
    assert plots.source_label(_runs()) == "Simulated"
    assert plots.source_label(_live(_runs())) == "Live"
    assert plots.source_label(_runs() + _live(_runs())) == "Live and simulated"


@pytest.mark.parametrize("live", [False, True])
def test_attainment_title_says_live_or_simulated_and_the_setup(live: bool) -> None:
    # make run's case: one workload at one rate, two policies, one narrow panel.
    runs = _runs(policies=("static", "fluidpd"), workloads=("azure-mixed",), rates=(20.0,))
    slo = "TTFT ≤ 2 s, TPOT ≤ 100 ms"
    fig = plots._attainment_figure(_live(runs) if live else runs, slo, False)
    title = _title_fits(fig)
    source = "Live" if live else "Simulated"
    assert title.startswith(f"{source}: overall SLO attainment vs request rate"), title
    assert "llama-3.1-8b on a100-80gb from 4P4D, TTFT ≤ 2 s, TPOT ≤ 100 ms" in title


def test_ablation_title_and_timeseries_title_name_the_runs() -> None:
    fig = plots._ablation_figure(_live(_runs(policies=plots.ABLATION_COMPONENTS)), None)
    assert _title_fits(fig).startswith("Live: component ablation, overall SLO attainment")
    series = {p: _series(p) for p in ("static", "fluidpd")}
    title = "Live: Static vs FluidPD over time, Azure (mixed) at 20 req/s"
    fig = plots._timeseries_figure(series, title, 2.0, ())
    assert _title_fits(fig) == title


def test_write_plots_titles_live_and_simulated_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs(policies=("static", "fluidpd"), workloads=("azure-mixed",), rates=(20.0,))
    series = _series_map([("azure-mixed", 20.0)], ("static", "fluidpd"))
    seen: list[str] = []
    real_save = plots._save

    def save(fig: Any, path: Path) -> Path:
        seen.append(" ".join(fig.get_suptitle().split()))
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    write_plots(tmp_path / "sim", runs, series, 2.0)
    write_plots(tmp_path / "live", _live(runs), series, 2.0)
    assert [t.split(":")[0] for t in seen] == ["Simulated"] * 2 + ["Live"] * 2, seen
    assert "Live: Static vs FluidPD over time, Azure (mixed) at 20 req/s" in seen


@pytest.mark.parametrize("autoscale", [False, True])
def test_split_axis_is_labelled_one_way(autoscale: bool) -> None:
    """Prefill workers on the y axis in every figure, with or without a fixed worker count; a
    worker mid-switch (in neither role) does not change the count the title gives."""
    fixed = _series("fluidpd")
    fixed["n_decode"] = [d - (1 if 119 <= i < 122 else 0) for i, d in enumerate(fixed["n_decode"])]
    series = {"static": _series("static"), "fluidpd": fixed}
    if autoscale:
        grown = _series("autoscale")
        grown["n_decode"] = [4 if x < 150 else 5 for x in grown["t"]]
        series["autoscale"] = grown
    fig = plots._timeseries_figure(series, "t", 2.0, ())
    split = fig.axes[2]
    assert split.get_ylabel() == "Prefill workers"
    assert [t.get_text() for t in split.get_yticklabels()] == ["4", "5"]
    expected = "the rest decode; autoscale" if autoscale else "of 8 workers, the rest decode"
    assert expected in split.get_title(loc="left")
