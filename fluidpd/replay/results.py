"""Turns a replay into the simulator's results.json record, time series and results directory.

The replayed requests become :class:`fluidpd.core.types.Request` objects so that
:func:`fluidpd.sim.metrics.run_metrics` computes exactly the fields ``fluidpd sim`` writes; a run
record from either command can be tabulated and plotted by the same code.

A results directory accumulates replays: when ``DIR/results.json`` already exists, the new record
is appended to its ``runs`` (time series of earlier runs stay in ``DIR/timeseries/``, and each
run's per-request log in ``DIR/requests/``), so
``--label static`` and ``--label fluidpd`` replays of one workload land in one file and one set of
plots. Re-running a label at the same rate adds another record (plots average such repeats).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fluidpd.core.types import SLO, Request
from fluidpd.replay.client import Outcome, ReplayResult, StatsSample
from fluidpd.sim.metrics import p95_ttft_series, run_metrics, windowed_attainment
from fluidpd.sim.report import RUN_FILE, series_key, slug, write_results
from fluidpd.sim.runner import RunOutput
from fluidpd.sim.workloads import Workload

__all__ = [
    "RESULTS_FILE",
    "ReplayMeta",
    "ResultsFileError",
    "build_output",
    "error_histogram",
    "load_previous",
    "load_series",
    "request_rows",
    "requests_path",
    "series_path",
    "to_requests",
    "write_replay_results",
    "write_request_log",
]

RESULTS_FILE = "results.json"
#: Distinct error messages kept in a record; the rest are summed under one key so that
#: per-request details (lengths in a 400 message) cannot bloat results.json.
MAX_ERROR_KINDS = 50
OTHER_ERRORS = "(other errors)"
_SERIES_KEYS = (
    "t",
    "n_prefill",
    "n_decode",
    "prefill_queue",
    "stolen_tokens",
    "ppi_bar",
    "dpi_load_bar",
    "dpi_adm_bar",
)
_PRESSURE_KEYS = ("ppi_bar", "dpi_load_bar", "dpi_adm_bar")


class ResultsFileError(ValueError):
    """An existing results.json that cannot be appended to (one-line message)."""


@dataclass(frozen=True, slots=True)
class ReplayMeta:
    """What the results record says about the run besides its measurements."""

    label: str
    rps: float
    workload: str
    model: str
    gpu: str
    pd: str
    slo: SLO
    seed: int
    endpoint: str
    served_model: str
    api: str
    prompt_format: str
    timeout_s: float
    max_concurrency: int | None
    command: str


# -- requests and metrics ---------------------------------------------------------------------
def to_requests(outcomes: Sequence[Outcome]) -> list[Request]:
    """One :class:`Request` per outcome (rid = workload index, arrival = scheduled send time).

    A completed request's ``max_new_tokens`` is the output length the server reported, because
    TPOT divides by it (``sglang.bench_serving`` uses the real output length too); a failed one
    keeps the requested length and, as in the simulator, no finish time.
    """
    out: list[Request] = []
    for o in outcomes:
        done = not o.failed
        req = Request(
            rid=o.index,
            arrival=o.scheduled,
            prompt_len=o.prompt_len,
            max_new_tokens=o.output_tokens if done and o.output_tokens > 0 else o.max_tokens,
        )
        req.first_token_t = o.first_token
        req.finish_t = o.finish if done else math.nan
        req.failed = not done
        out.append(req)
    return out


def error_histogram(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """{message: count}, most frequent first, at most :data:`MAX_ERROR_KINDS` keys + one."""
    counts = Counter(o.error for o in outcomes if o.error is not None)
    ranked = counts.most_common()
    hist = dict(ranked[:MAX_ERROR_KINDS])
    rest = sum(n for _, n in ranked[MAX_ERROR_KINDS:])
    if rest:
        hist[OTHER_ERRORS] = rest
    return hist


def _lag_ms(outcomes: Sequence[Outcome]) -> dict[str, float | None]:
    """How late requests left against their schedule: the evidence that the client kept up."""
    lags = np.array([o.sent - o.scheduled for o in outcomes if not math.isnan(o.sent)])
    if lags.size == 0:
        return {"mean": None, "p99": None, "max": None}
    return {
        "mean": round(float(lags.mean()) * 1e3, 3),
        "p99": round(float(np.percentile(lags, 99)) * 1e3, 3),
        "max": round(float(lags.max()) * 1e3, 3),
    }


# -- /admin/stats -----------------------------------------------------------------------------
def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def _switch_key(switch: Any) -> str:
    return json.dumps(switch, sort_keys=True, default=str)


def new_role_switches(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Switches in ``after`` that ``before`` did not list: a long-running router reports its
    whole history, and only this replay's switches belong to this run."""
    if after is None:
        return []
    seen = {_switch_key(s) for s in (before or {}).get("role_switches") or []}
    return [
        dict(s)
        for s in after.get("role_switches") or []
        if isinstance(s, dict) and _switch_key(s) not in seen
    ]


def stolen_during(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> int:
    """Tokens stolen during the replay (the router's counter is cumulative since its start; a
    counter that went down means the router restarted, so its whole value counts)."""
    if after is None:
        return 0
    start, end = _int((before or {}).get("stolen_tokens")), _int(after.get("stolen_tokens"))
    return end - start if end >= start else end


def stats_series(
    before: Mapping[str, Any] | None, samples: Sequence[StatsSample]
) -> dict[str, list[Any]]:
    """The simulator's per-interval series from ``/admin/stats`` samples; the pressure indices
    are 0.0 where the router does not report them."""
    series: dict[str, list[Any]] = {k: [] for k in _SERIES_KEYS}
    previous = _int((before or {}).get("stolen_tokens")) if before else None
    for sample in samples:
        stats = sample.stats
        workers = [w for w in stats.get("workers") or [] if isinstance(w, dict)]
        prefill = [w for w in workers if w.get("role") == "prefill"]
        stolen = _int(stats.get("stolen_tokens"))
        series["t"].append(sample.t)
        series["n_prefill"].append(len(prefill))
        series["n_decode"].append(sum(1 for w in workers if w.get("role") == "decode"))
        series["prefill_queue"].append(sum(_int(w.get("queue_len")) for w in prefill))
        # Per interval, like the simulator; the first sample counts from the pre-replay probe.
        base = stolen if previous is None or stolen < previous else previous
        series["stolen_tokens"].append(stolen - base)
        previous = stolen
        for key in _PRESSURE_KEYS:
            series[key].append(_float(stats.get(key)))
    return series


# -- the run record ---------------------------------------------------------------------------
def p95_bin_s(workload: Workload) -> float:
    """The simulator's 10 s bins, or 1 s for replays shorter than 100 s (else one bin)."""
    return 10.0 if float(workload.arrivals[-1]) >= 100.0 else 1.0


def build_output(
    meta: ReplayMeta, workload: Workload, result: ReplayResult
) -> tuple[RunOutput, list[Request]]:
    """The results.json record and time series of one replay, plus its requests."""
    requests = to_requests(result.outcomes)
    after = result.stats_after
    if after is None and result.samples:
        after = result.samples[-1].stats
    record: dict[str, Any] = {
        "policy": meta.label,
        "rps": meta.rps,
        "workload": meta.workload,
        "model": meta.model,
        "gpu": meta.gpu,
        "pd": meta.pd,
        "ttft_slo": meta.slo.ttft,
        "tpot_slo": meta.slo.tpot,
        "seed": meta.seed,
    }
    record.update(run_metrics(requests, meta.slo))
    record.update(
        {
            "role_switches": new_role_switches(result.stats_before, after),
            "stolen_tokens": stolen_during(result.stats_before, after),
            "window_attainment": windowed_attainment(requests, workload.windows, meta.slo),
            "wall_s": round(result.wall_s, 3),
            "errors": error_histogram(result.outcomes),
            "endpoint": meta.endpoint,
            "served_model": meta.served_model,
            "api": meta.api,
            "prompt_format": meta.prompt_format,
            "timeout_s": meta.timeout_s,
            "max_concurrency": meta.max_concurrency,
            "num_requests": len(requests),
            # Completed requests that stopped short of max_tokens (a server ignoring ignore_eos).
            "short_outputs": sum(
                1 for o in result.outcomes if not o.failed and o.output_tokens < o.max_tokens
            ),
            "send_lag_ms": _lag_ms(result.outcomes),
            "admin_stats": result.stats_before is not None or bool(result.samples),
            "event_loop": result.event_loop,
            "command": meta.command,
        }
    )
    series: dict[str, Any] = dict(stats_series(result.stats_before, result.samples))
    bins_t, p95 = p95_ttft_series(requests, p95_bin_s(workload), meta.timeout_s)
    series["p95_ttft_t"] = bins_t
    series["p95_ttft"] = p95
    return RunOutput(record, series), requests


# -- the results directory --------------------------------------------------------------------
def load_previous(out_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """Runs of an existing ``DIR/results.json`` and the command that made them (from its
    ``run.json``; none: ``[]``, ``""``).

    Raises :class:`ResultsFileError` for a file that is not a results file, so that a replay
    does not run for an hour and then fail to save.
    """
    path = out_dir / RESULTS_FILE
    if not path.exists():
        return [], ""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ResultsFileError(f"{path}: cannot append to it: {exc}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ResultsFileError(f"{path}: cannot append to it: no 'runs' list of records")
    # The command is in run.json (results.json of this version has none; an older one's has).
    command = doc.get("command")
    # A missing or unreadable run.json only loses the earlier command, not the records.
    with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
        run = json.loads((out_dir / RUN_FILE).read_text())
        if isinstance(run, dict):
            command = run.get("command", command)
    return runs, command if isinstance(command, str) else ""


def _run_file(out_dir: Path, folder: str, record: Mapping[str, Any], suffix: str) -> Path:
    workload, rps, policy = series_key(record)
    return out_dir / folder / f"{slug(Path(workload).stem)}_{rps:g}rps_{policy}{suffix}"


def series_path(out_dir: Path, record: Mapping[str, Any]) -> Path:
    """Where :func:`fluidpd.sim.report.write_results` puts a run's time series (same naming, so
    its private slug helper is reused rather than copied)."""
    return _run_file(out_dir, "timeseries", record, ".json")


def requests_path(out_dir: Path, record: Mapping[str, Any]) -> Path:
    """Where a replay's per-request log goes, named like its time series."""
    return _run_file(out_dir, "requests", record, ".jsonl")


def _ms(start: float, end: float) -> float | None:
    return None if math.isnan(start) or math.isnan(end) else round(1e3 * (end - start), 3)


def request_rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One row per request, in workload order (as sglang.bench_serving's ``--output-details``
    and vLLM's ``--save-detailed``): when it was due, sent, first token and finished (seconds
    since the replay start; None if it never happened), TTFT and mean TPOT (ms), lengths, and
    the error of a failed one. The aggregate records hide how a distribution moved."""
    rows = []
    for o in outcomes:
        tpot = None
        if o.output_tokens > 1 and not (math.isnan(o.first_token) or math.isnan(o.finish)):
            tpot = round(1e3 * (o.finish - o.first_token) / (o.output_tokens - 1), 3)
        rows.append(
            {
                "i": o.index,
                "scheduled_s": round(o.scheduled, 6),
                "sent_s": None if math.isnan(o.sent) else round(o.sent, 6),
                "ttft_ms": _ms(o.scheduled, o.first_token),  # as the run's metrics count it
                "tpot_ms": tpot,
                "e2e_ms": _ms(o.scheduled, o.finish),
                "prompt_len": o.prompt_len,
                "max_tokens": o.max_tokens,
                "output_tokens": o.output_tokens,
                "error": o.error,
            }
        )
    return rows


def write_request_log(path: Path, outcomes: Sequence[Outcome]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in request_rows(outcomes)))


def load_series(out_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """An earlier run's saved time series, or {} when it has none (or it is unreadable)."""
    try:
        doc = json.loads(series_path(out_dir, record).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_replay_results(
    out_dir: Path,
    previous: Sequence[dict[str, Any]],
    previous_command: str,
    output: RunOutput,
) -> Path:
    """Writes results.json with ``previous`` runs followed by ``output`` (its time series goes
    to ``DIR/timeseries/``); ``command.txt`` lists every command that contributed, one a line."""
    command = str(output.record.get("command", ""))
    commands = f"{previous_command}\n{command}" if previous_command else command
    outputs = [RunOutput(dict(r)) for r in previous] + [output]
    return write_results(out_dir, outputs, commands)
