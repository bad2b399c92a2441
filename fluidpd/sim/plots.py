"""Paper-style figures from ``fluidpd sim`` results (Fig. 9a, 10 and 11 of the FluidPD paper).

Every function takes plain ``results.json`` records / time-series dicts, so the figures can be
redrawn from a saved results directory without re-running the simulator. Figures are built on
:class:`matplotlib.figure.Figure` objects directly (no pyplot state) and rendered with the
non-interactive Agg backend. A plot whose inputs hold nothing to draw is skipped: nothing is
written and nothing is raised.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from fluidpd.sim.report import slug

matplotlib.use("Agg")

__all__ = [
    "ABLATION_COMPONENTS",
    "ABLATION_POLICIES",
    "POLICY_COLORS",
    "POLICY_LABELS",
    "POLICY_ORDER",
    "plot_ablation",
    "plot_attainment_vs_rps",
    "plot_timeseries",
    "source_label",
    "window_edges",
    "write_plots",
]

DPI = 120

#: Plot order of the known policies (baselines first, the full system and the oracle last).
POLICY_ORDER: tuple[str, ...] = (
    "static",
    "autoscale",
    "fluidtoken",
    "fluidrole",
    "fluidpd",
    "oracle",
)
#: One colour per policy, shared by every figure.
POLICY_COLORS: dict[str, str] = {
    "static": "#7f7f7f",  # grey: the SGLang static baseline
    "autoscale": "#8c564b",  # brown: Dynamo-like autoscaling
    "fluidtoken": "#ff7f0e",  # orange
    "fluidrole": "#2ca02c",  # green
    "fluidpd": "#d62728",  # red: the full system
    "oracle": "#9467bd",  # purple: hindsight-best static split
}
POLICY_LABELS: dict[str, str] = {
    "static": "Static",
    "autoscale": "Autoscale",
    "fluidtoken": "FluidToken-only",
    "fluidrole": "FluidRole-only",
    "fluidpd": "FluidPD",
    "oracle": "Oracle (best static)",
}
_POLICY_MARKERS: dict[str, str] = {
    "static": "o",
    "autoscale": "v",
    "fluidtoken": "s",
    "fluidrole": "^",
    "fluidpd": "D",
    "oracle": "*",
}
_SPARE_COLORS = ("#1f77b4", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939")
_SPARE_MARKERS = ("P", "X", "h", "p", "<", ">")
#: The policies of the component ablation (Fig. 11), in bar order; oracle only when present.
ABLATION_POLICIES: tuple[str, ...] = ("static", "fluidtoken", "fluidrole", "fluidpd", "oracle")
#: An ablation is drawn only for a workload that ran every one of these (at the chosen rate):
#: the baseline, each mechanism alone, and both together.
ABLATION_COMPONENTS: tuple[str, ...] = ("static", "fluidtoken", "fluidrole", "fluidpd")
_WORKLOAD_LABELS = {"azure-mixed": "Azure (mixed)", "azure-staged": "Azure (staged)"}
# Fields that tell apart runs of one workload drawn in separate panels when they vary.
_CONFIG_FIELDS = ("model", "gpu", "pd")
_STATIC_ATTAINMENT_KNEE = 0.9
_MAX_STOLEN_BARS = 200
_MAX_RATE_TICKS = 10
_MAX_SPLIT_TICKS = 10
#: Average width of a character of the bold title font, in inches at 12 pt (for wrapping).
_TITLE_CHAR_IN = 0.105


# -- small helpers ----------------------------------------------------------------------------
def _num(value: Any) -> float | None:
    """``value`` as a finite float, else None (None, NaN, strings, ...)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _array(values: Any) -> np.ndarray:
    """A float array of a list that may hold None (-> NaN); empty for anything else."""
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        return np.empty(0)
    out = [_num(v) for v in values]
    return np.array([math.nan if v is None else v for v in out], dtype=np.float64)


def _ordered(policies: Iterable[str]) -> list[str]:
    names = set(policies)
    known = [p for p in POLICY_ORDER if p in names]
    return known + sorted(names - set(POLICY_ORDER))


def _extra_index(policy: str) -> int:
    # Deterministic across figures and processes (str hash is salted, so no hash()).
    return sum(policy.encode()) % len(_SPARE_COLORS)


def _color(policy: str) -> str:
    return POLICY_COLORS.get(policy) or _SPARE_COLORS[_extra_index(policy)]


def _marker(policy: str) -> str:
    return _POLICY_MARKERS.get(policy) or _SPARE_MARKERS[_extra_index(policy)]


def _label(policy: str) -> str:
    return POLICY_LABELS.get(policy, policy)


def _workload_label(workload: str) -> str:
    if workload in _WORKLOAD_LABELS:
        return _WORKLOAD_LABELS[workload]
    if workload.endswith(".csv") or "/" in workload:
        return Path(workload).name
    return workload


def _policy_handle(policy: str, marker: bool = True) -> Line2D:
    return Line2D(
        [],
        [],
        color=_color(policy),
        marker=_marker(policy) if marker else None,
        linewidth=2,
        label=_label(policy),
    )


def _legend(fig: Figure, handles: Sequence[Any]) -> None:
    """A figure legend below the panels, in as few rows as fit the figure's width."""
    width = float(fig.get_figwidth()) - 0.3
    # Rough entry width at the default 10 pt font: handle + padding + ~0.085 in per character.
    entries = [0.9 + 0.085 * len(str(h.get_label())) for h in handles]
    per_row = max(1, len(handles))
    while (
        per_row > 1
        and max(sum(entries[i : i + per_row]) for i in range(0, len(entries), per_row)) > width
    ):
        per_row -= 1
    rows = math.ceil(len(handles) / per_row)
    fig.legend(handles=handles, loc="outside lower center", ncols=math.ceil(len(handles) / rows))


def source_label(runs: Iterable[Mapping[str, Any]]) -> str:
    """What the runs are: "Live" (replays against an endpoint record it), "Simulated", or
    both."""
    live = {"endpoint" in r for r in runs}
    if live == {True}:
        return "Live"
    return "Simulated" if live == {False} else "Live and simulated"


def _setup_label(runs: Sequence[Mapping[str, Any]]) -> str:
    """The model, GPU and initial split the runs share ("" for what they do not share)."""
    parts = []
    for field, fmt in (("model", "{}"), ("gpu", "on {}"), ("pd", "from {}")):
        values = {str(r.get(field)) for r in runs if r.get(field) not in (None, "", "unknown")}
        if len(values) == 1:
            parts.append(fmt.format(values.pop()))
    return " ".join(parts)


def _suptitle(fig: Figure, *lines: str) -> None:
    """A bold figure title, each line wrapped to the figure's width so none is cut off."""
    width = max(20, int((float(fig.get_figwidth()) - 0.4) / _TITLE_CHAR_IN))
    wrapped = [w for line in lines if line for w in textwrap.wrap(line, width)]
    fig.suptitle("\n".join(wrapped), fontweight="bold")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _panel_keys(runs: Sequence[Mapping[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    """Per run: (workload, the values of the config fields that vary within that workload)."""
    values: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in runs:
        for f in _CONFIG_FIELDS:
            values[str(r.get("workload", "?"))][f].add(str(r.get(f, "")))
    keys = []
    for r in runs:
        w = str(r.get("workload", "?"))
        varying = tuple(str(r.get(f, "")) for f in _CONFIG_FIELDS if len(values[w][f]) > 1)
        keys.append((w, varying))
    return keys


def _panel_title(key: tuple[str, tuple[str, ...]]) -> str:
    workload, extra = key
    return " · ".join([_workload_label(workload), *extra])


def _mean_by(
    runs: Sequence[Mapping[str, Any]], field: str
) -> dict[tuple[tuple[str, tuple[str, ...]], str, float], float]:
    """Mean of ``field`` per (panel, policy, rps), over repeated runs (seeds); non-numeric
    values are left out."""
    acc: dict[tuple[tuple[str, tuple[str, ...]], str, float], list[float]] = defaultdict(list)
    for key, r in zip(_panel_keys(runs), runs, strict=True):
        rps, value = _num(r.get("rps")), _num(r.get(field))
        if rps is None or value is None:
            continue
        acc[(key, str(r.get("policy", "?")), rps)].append(value)
    return {k: float(np.mean(v)) for k, v in acc.items()}


def _grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


# -- Fig. 9a ----------------------------------------------------------------------------------
def _attainment_figure(
    runs: Sequence[Mapping[str, Any]], slo_label: str, show_ttft: bool
) -> Figure | None:
    """Fig. 9a, titled with what the runs are (live or simulated) and their shared setup."""
    slo = _mean_by(runs, "slo_attainment")
    if not slo:
        return None
    ttft = _mean_by(runs, "ttft_attainment") if show_ttft else {}
    panels = sorted({k[0] for k in slo}, key=lambda k: (k[0], k[1]))
    policies = _ordered({k[1] for k in slo})
    nrows, ncols = _grid_shape(len(panels))
    # A single panel gets room for its two-line title.
    fig = Figure(figsize=(max(6.0, 4.6 * ncols), 3.5 * nrows + 1.1), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, panel in enumerate(panels):
        ax: Axes = axes.flat[i]
        for policy in policies:
            pts = sorted(
                (rps, v) for (p, pol, rps), v in slo.items() if p == panel and pol == policy
            )
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ax.plot(
                xs,
                [100 * y for _, y in pts],
                color=_color(policy),
                marker=_marker(policy),
                markersize=6,
                linewidth=2,
                label=_label(policy),
                clip_on=False,
                zorder=3,
            )
            tpts = sorted((r, v) for (p, pol, r), v in ttft.items() if p == panel and pol == policy)
            if tpts:
                ax.plot(
                    [x for x, _ in tpts],
                    [100 * y for _, y in tpts],
                    color=_color(policy),
                    linestyle="--",
                    linewidth=1.2,
                    alpha=0.8,
                    clip_on=False,
                    zorder=2,
                )
        rates = sorted({rps for (p, _, rps) in slo if p == panel})
        if len(rates) <= _MAX_RATE_TICKS:
            ax.set_xticks(rates)
            ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.set_title(_panel_title(panel))
        ax.set_xlabel("Request rate (req/s)")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.35)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles: list[Any] = [_policy_handle(p) for p in policies]
    if ttft:
        handles += [
            Line2D([], [], color="black", linewidth=2, label="overall SLO"),
            Line2D([], [], color="black", linestyle="--", linewidth=1.2, label="TTFT only"),
        ]
    setup = ", ".join(p for p in (_setup_label(runs), slo_label) if p)
    _suptitle(fig, f"{source_label(runs)}: overall SLO attainment vs request rate", setup)
    _legend(fig, handles)
    return fig


def plot_attainment_vs_rps(
    runs: Sequence[Mapping[str, Any]],
    path: Path,
    slo_label: str = "",
    *,
    show_ttft: bool = False,
) -> Path:
    """Fig. 9a: overall SLO attainment (%) against the offered rate, one panel per workload
    (split further by model/GPU/P-D start when those vary within a workload), one line per
    policy; repeated runs (seeds) are averaged. ``show_ttft`` adds dashed TTFT-attainment lines.
    Returns ``path``; writes nothing when no run has an attainment value."""
    fig = _attainment_figure(runs, slo_label, show_ttft)
    return path if fig is None else _save(fig, path)


# -- Fig. 10 ----------------------------------------------------------------------------------
def _xy(series: Mapping[str, Any], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = _array(series.get(x_key)), _array(series.get(y_key))
    n = min(x.size, y.size)
    return x[:n], y[:n]


def _rebin(t: np.ndarray, y: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Sums ``y`` over consecutive groups of samples so at most ``max_bins`` remain; returns
    (group start times, sums, group duration in s)."""
    dt = float(np.median(np.diff(t))) if t.size > 1 else 1.0
    k = max(1, math.ceil(t.size / max_bins))
    if k == 1:
        return t, np.nan_to_num(y), dt
    n = math.ceil(t.size / k) * k
    padded = np.zeros(n)
    padded[: y.size] = np.nan_to_num(y)
    return t[::k], padded.reshape(-1, k).sum(axis=1), dt * k


def _timeseries_figure(
    series_by_policy: Mapping[str, Mapping[str, Any]],
    title: str,
    ttft_slo: float | None,
    window_edges: Sequence[float],
) -> Figure | None:
    policies = [
        p
        for p in _ordered(series_by_policy)
        if _xy(series_by_policy[p], "t", "n_prefill")[0].size
        or _xy(series_by_policy[p], "p95_ttft_t", "p95_ttft")[0].size
    ]
    if not policies:
        return None
    fig = Figure(figsize=(9.5, 10.0), layout="constrained")
    ax_ttft, ax_queue, ax_split, ax_stolen = fig.subplots(4, 1, sharex=True).tolist()
    t_max = 0.0

    # (1) p95 TTFT per arrival bin, log scale.
    positive = False
    for policy in policies:
        t, v = _xy(series_by_policy[policy], "p95_ttft_t", "p95_ttft")
        if not t.size:
            continue
        width = float(np.median(np.diff(t))) if t.size > 1 else 10.0
        v = np.where(v > 0, np.maximum(v, 1e-3), np.nan)
        positive = positive or bool(np.isfinite(v).any())
        ax_ttft.plot(t + width / 2, v, color=_color(policy), linewidth=1.6)
        t_max = max(t_max, float(t[-1] + width))
    if positive:
        ax_ttft.set_yscale("log")
    if ttft_slo is not None and ttft_slo > 0:
        ax_ttft.axhline(ttft_slo, color="black", linestyle="--", linewidth=1.2, zorder=1)
    ax_ttft.set_ylabel("p95 TTFT (s)")
    ax_ttft.set_title("p95 TTFT per arrival bin", loc="left", fontsize=10)

    # (2) prefill queue length.
    for policy in policies:
        t, q = _xy(series_by_policy[policy], "t", "prefill_queue")
        if t.size:
            ax_queue.plot(t, q, color=_color(policy), linewidth=1.4)
            t_max = max(t_max, float(t[-1]))
    ax_queue.set_ylabel("Prefill queue (req)")
    ax_queue.set_ylim(bottom=0)
    ax_queue.set_title("Queued prefill requests (all prefill workers)", loc="left", fontsize=10)

    # (3) P/D split: prefill workers, a small per-policy offset keeps equal lines apart.
    split: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    for policy in policies:
        t, n_p = _xy(series_by_policy[policy], "t", "n_prefill")
        if t.size:
            split.append((policy, t, n_p, _xy(series_by_policy[policy], "t", "n_decode")[1]))
    totals = {
        float(v)
        for _, _, n_p, n_d in split
        for v in (n_p[: n_d.size] + n_d[: n_p.size])
        if math.isfinite(v)
    }
    levels: set[int] = set()
    for i, (policy, t, n_p, _) in enumerate(split):
        offset = 0.06 * (i - (len(split) - 1) / 2)
        ax_split.step(t, n_p + offset, where="post", color=_color(policy), linewidth=1.8)
        levels.update(int(v) for v in n_p if math.isfinite(v))
        t_max = max(t_max, float(t[-1]))
    # One labelling in every figure: the y axis counts prefill workers; the panel title says
    # how many workers there are (a worker mid-switch counts in neither role, so the most
    # seen at once), or that autoscaling changes that number.
    if levels:
        lo, hi = min(levels), max(levels)
        ax_split.set_ylim(lo - 0.6, hi + 0.6)
        ticks = list(range(lo, hi + 1))
        ax_split.set_yticks(ticks)
        if len(ticks) > _MAX_SPLIT_TICKS:
            ax_split.yaxis.set_major_locator(MaxNLocator(nbins=_MAX_SPLIT_TICKS, integer=True))
    ax_split.set_ylabel("Prefill workers")
    if "autoscale" in (p for p, *_ in split) or not totals:
        of = "the rest decode; autoscale adds and removes workers"
    else:
        of = f"of {round(max(totals))} workers, the rest decode"
    ax_split.set_title(f"P/D split: prefill workers ({of})", loc="left", fontsize=10)

    # (4) stolen tokens, summed into at most _MAX_STOLEN_BARS intervals.
    interval: float | None = None
    drawn = False
    for policy in policies:
        t, s = _xy(series_by_policy[policy], "t", "stolen_tokens")
        if not t.size or not np.nansum(s) > 0:
            continue
        tb, sb, interval = _rebin(t, s, _MAX_STOLEN_BARS)
        ax_stolen.step(tb, sb, where="post", color=_color(policy), linewidth=1.2)
        ax_stolen.fill_between(tb, sb, step="post", color=_color(policy), alpha=0.2)
        drawn = True
    if not drawn:
        ax_stolen.text(
            0.5,
            0.5,
            "no tokens stolen",
            transform=ax_stolen.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
        ax_stolen.set_yticks([0])
    ax_stolen.set_ylim(bottom=0)
    per = f"per {interval:g} s" if interval else "per interval"
    ax_stolen.set_ylabel(f"Stolen tokens\n({per})")
    ax_stolen.set_title(
        "Prefill tokens stolen by decode workers (FluidToken)", loc="left", fontsize=10
    )
    ax_stolen.set_xlabel("Time (s)")

    edges = [e for e in (_num(x) for x in window_edges) if e is not None]
    for ax in (ax_ttft, ax_queue, ax_split, ax_stolen):
        for e in edges:
            ax.axvline(e, color="0.25", linestyle=":", linewidth=1.2, zorder=0)
        ax.grid(True, alpha=0.3)
    if t_max > 0:
        ax_stolen.set_xlim(0, max(t_max, *edges) if edges else t_max)

    handles: list[Any] = [_policy_handle(p, marker=False) for p in policies]
    if ttft_slo is not None and ttft_slo > 0:
        handles.append(
            Line2D([], [], color="black", linestyle="--", label=f"TTFT SLO ({ttft_slo:g} s)")
        )
    if edges:
        handles.append(Line2D([], [], color="0.25", linestyle=":", label="window boundary"))
    _suptitle(fig, title)
    _legend(fig, handles)
    return fig


def plot_timeseries(
    series_by_policy: Mapping[str, Mapping[str, Any]],
    path: Path,
    title: str,
    ttft_slo: float | None = None,
    window_edges: Sequence[float] = (),
) -> Path:
    """Fig. 10: four stacked panels over time (s): p95 TTFT per arrival bin (log y, dashed SLO
    line), prefill queue length, the P/D split (prefill workers, step line) and stolen tokens
    per interval; dotted vertical lines at ``window_edges`` (staged window boundaries).
    ``series_by_policy`` maps a policy to its time-series dict (``RunOutput.series``).
    Returns ``path``; writes nothing when no policy has a time series."""
    fig = _timeseries_figure(series_by_policy, title, ttft_slo, window_edges)
    return path if fig is None else _save(fig, path)


# -- Fig. 11 ----------------------------------------------------------------------------------
def _pick_rps(
    workload: str,
    cells: Mapping[tuple[str, float], float],
    rps_by_workload: Mapping[str, float] | None,
) -> float:
    """The rate of one ablation group: the only one; else the requested one (nearest run
    rate); else the highest rate (shared by all its policies, when any is) at which static
    attainment is below 90 %; else the highest rate."""
    rates = sorted({rps for _, rps in cells})
    if len(rates) == 1:
        return rates[0]
    want = None if rps_by_workload is None else _num(rps_by_workload.get(workload))
    if want is not None:
        return min(rates, key=lambda r: (abs(r - want), -r))
    policies = {p for p, _ in cells}
    shared = [r for r in rates if all((p, r) in cells for p in policies)] or rates
    stressed = [r for r in shared if cells.get(("static", r), 1.0) < _STATIC_ATTAINMENT_KNEE]
    return max(stressed or shared)


def _ablation_figure(
    runs: Sequence[Mapping[str, Any]],
    rps_by_workload: Mapping[str, float] | None,
    slo_label: str = "",
) -> Figure | None:
    runs = [r for r in runs if r.get("policy") in ABLATION_POLICIES]
    slo = _mean_by(runs, "slo_attainment")
    cells: dict[tuple[str, tuple[str, ...]], dict[tuple[str, float], float]] = defaultdict(dict)
    for (panel, policy, rps), value in slo.items():
        cells[panel][(policy, rps)] = value
    chosen = {g: _pick_rps(g[0], cells[g], rps_by_workload) for g in cells}
    # Only workloads with the whole ablation at the rate shown: two bars are no ablation.
    groups = sorted(
        g for g in cells if all((p, chosen[g]) in cells[g] for p in ABLATION_COMPONENTS)
    )
    if not groups:
        return None
    policies = [p for p in ABLATION_POLICIES if any((p, chosen[g]) in cells[g] for g in groups)]
    width = 0.8 / len(policies)
    fig = Figure(
        figsize=(max(5.5, 1.0 + 0.55 * len(groups) * len(policies)), 4.6), layout="constrained"
    )
    ax = fig.subplots()
    for j, policy in enumerate(policies):
        xs, hs = [], []
        for i, g in enumerate(groups):
            cell = cells[g].get((policy, chosen[g]))
            if cell is not None:
                xs.append(i + (j - (len(policies) - 1) / 2) * width)
                hs.append(100 * cell)
        bars = ax.bar(
            xs,
            hs,
            width=width * 0.92,
            color=_color(policy),
            label=_label(policy),
            edgecolor="black",
            linewidth=0.5,
            zorder=2,
        )
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{_panel_title(g)}\n{chosen[g]:g} req/s" for g in groups])
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 112)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.grid(True, axis="y", alpha=0.35, zorder=0)
    _suptitle(
        fig,
        f"{source_label(runs)}: component ablation, overall SLO attainment",
        ", ".join(p for p in (_setup_label(runs), slo_label) if p),
    )
    _legend(
        fig,
        [
            Patch(facecolor=_color(p), edgecolor="black", linewidth=0.5, label=_label(p))
            for p in policies
        ],
    )
    return fig


def plot_ablation(
    runs: Sequence[Mapping[str, Any]],
    path: Path,
    rps_by_workload: Mapping[str, float] | None = None,
) -> Path:
    """Fig. 11: grouped bars of overall SLO attainment (%) of static, FluidToken-only,
    FluidRole-only, FluidPD (and oracle when present) per workload, with value labels. Each
    workload is shown at one rate: its only rate; else ``rps_by_workload[workload]`` (nearest
    rate run); else the highest rate at which static attainment is below 90 %; else the highest
    rate. A workload is left out unless all of ``ABLATION_COMPONENTS`` ran at that rate.
    Returns ``path``; writes nothing when no workload has the whole ablation."""
    fig = _ablation_figure(runs, rps_by_workload)
    return path if fig is None else _save(fig, path)


# -- all figures of a sweep --------------------------------------------------------------------
def window_edges(workload: Any) -> list[float]:
    """Arrival times (s) at which each window after the first starts, for a
    :class:`fluidpd.sim.workloads.Workload` (the ``window_edges`` of :func:`plot_timeseries`)."""
    return [float(workload.arrivals[a]) for _, a, b in workload.windows[1:] if b > a]


def _slo_label(runs: Sequence[Mapping[str, Any]], ttft_slo: float) -> str:
    ttft = {_num(r.get("ttft_slo")) for r in runs} - {None}
    tpot = {_num(r.get("tpot_slo")) for r in runs} - {None}
    parts = [f"TTFT ≤ {ttft.pop() if len(ttft) == 1 else ttft_slo:g} s"]
    if len(tpot) == 1:
        value = tpot.pop()
        assert value is not None
        parts.append(f"TPOT ≤ {value * 1e3:g} ms")
    return ", ".join(parts)


def write_plots(
    out_dir: Path,
    runs: Sequence[Mapping[str, Any]],
    series: Mapping[tuple[str, float, str], Mapping[str, Any]],
    ttft_slo: float,
    window_edges_by_workload: Mapping[str, Sequence[float]] | None = None,
    rps_by_workload: Mapping[str, float] | None = None,
) -> list[Path]:
    """Writes ``attainment_vs_rps.png``, ``ablation.png`` and one
    ``timeseries_<workload>_<rps>.png`` per (workload, rps) in ``series`` (keyed by
    (workload, rps, policy)) into ``out_dir``; a figure with nothing to draw is skipped.
    Returns the paths written."""
    written: list[Path] = []
    slo_label = _slo_label(runs, ttft_slo)
    fig = _attainment_figure(runs, slo_label, show_ttft=False)
    if fig is not None:
        written.append(_save(fig, out_dir / "attainment_vs_rps.png"))
    fig = _ablation_figure(runs, rps_by_workload, slo_label)
    if fig is not None:
        written.append(_save(fig, out_dir / "ablation.png"))
    by_run: dict[tuple[str, float], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for (workload, rps, policy), s in series.items():
        if s:
            by_run[(str(workload), float(rps))][str(policy)] = s
    edges_by = window_edges_by_workload or {}
    source = source_label(runs) if runs else "Simulated"
    for (workload, rps), per_policy in sorted(by_run.items()):
        at = [r for r in runs if str(r.get("workload")) == workload and _num(r.get("rps")) == rps]
        shown = " vs ".join(_label(p) for p in _ordered(per_policy))
        fig = _timeseries_figure(
            per_policy,
            f"{source_label(at) if at else source}: {shown} over time, "
            f"{_workload_label(workload)} at {rps:g} req/s",
            ttft_slo,
            edges_by.get(workload, ()),
        )
        if fig is not None:
            name = f"timeseries_{slug(Path(workload).stem)}_{rps:g}.png"
            written.append(_save(fig, out_dir / name))
    return written
