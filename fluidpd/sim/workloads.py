"""Benchmark workloads for the simulator, built from the Azure LLM inference traces (2023).

The paper (§III, §V-A) evaluates on two workloads cut from the week-long 2024 Azure traces. Those
files are not available here, so both are rebuilt from the 2023 traces (``code``: 8,819 rows,
``conv``: 19,366 rows); see ``shared/data/traces/README.md`` §4 for why these choices were made.

``azure-staged`` (sustained P/D demand shift)
    Three consecutive windows of exactly 10,000 requests, labelled ``conv-1``, ``code`` and
    ``conv-2``: conv rows [0:10000]; then all 8,819 code rows in trace order followed by 1,181 code
    rows resampled with replacement; then conv rows [10000:19366] (9,366 rows) followed by 634 rows
    resampled with replacement from conv[10000:]. The 2023 code trace is too short for a disjoint
    10K window, so resampling (README option (b)) keeps the three windows the same size as in the
    paper. Arrivals are one Poisson process at ``rps`` over all 30,000 requests, because the paper
    replays this workload at a constant Poisson rate (§III-A).

``azure-mixed`` (short bursts)
    Code and conv merged by TIMESTAMP (stable, code first on ties). Of the 10,000-request windows
    starting every 1,000 rows, the one whose inter-arrival gaps have the highest coefficient of
    variation (population std / mean) is kept. Its native gaps are scaled by
    ``native mean rate / rps`` so the burst shape survives while the mean rate hits the target.

``synthetic``
    Poisson arrivals at ``rps``; prompt lengths lognormal with median 1,000 and sigma 0.8,
    clipped to [16, 8192]; output lengths lognormal with median 100 and sigma 0.8, clipped to
    [1, 1024]. 2,000 requests unless ``num_requests`` says otherwise.

A CSV path
    Every row of a file with the Azure columns (TIMESTAMP, ContextTokens, GeneratedTokens), in time
    order, with native gaps scaled to ``rps`` as for ``azure-mixed`` but without a window search.

Afterwards ``num_requests`` keeps the first N requests (for ``synthetic`` it sets how many are
drawn) and ``context_limit`` caps each prompt at ``context_limit - output_len`` (at least 1).

All randomness comes from one ``numpy.random.default_rng(seed)`` per build, drawn in a fixed
order, so a seed always gives the same workload. Every user-facing problem (bad argument, missing
file, malformed row) raises :class:`WorkloadError` with a one-line message.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from numbers import Integral, Real
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from fluidpd.sim.longctx import (
    LONG_DEFAULT_REQUESTS,
    LONG_WORKLOAD_NAMES,
    build_long,
    lognormal_lengths,
    poisson_arrivals,
)

__all__ = [
    "WORKLOAD_NAMES",
    "Workload",
    "WorkloadError",
    "build_workload",
    "load_trace_csv",
    "traces_dir",
]

WORKLOAD_NAMES: tuple[str, ...] = (
    "azure-staged",
    "azure-mixed",
    "synthetic",
    *LONG_WORKLOAD_NAMES,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_Scalar = TypeVar("_Scalar", bound=np.generic)

TRACES_ENV = "FLUIDPD_TRACES_DIR"
_FALLBACK_TRACES_DIR = Path("/work/shared/data/traces")
_AZURE_SUBDIR = "azure_llm_2023"
_CODE_FILE = "AzureLLMInferenceTrace_code.csv"
_CONV_FILE = "AzureLLMInferenceTrace_conv.csv"

COL_TIME = "TIMESTAMP"
COL_PROMPT = "ContextTokens"
COL_OUTPUT = "GeneratedTokens"
_REQUIRED_COLUMNS = (COL_TIME, COL_PROMPT, COL_OUTPUT)

WINDOW_SIZE = 10_000
MIXED_STEP = 1_000
SYNTHETIC_DEFAULT_REQUESTS = 2_000
SYNTHETIC_PROMPT = (1000.0, 0.8, 16, 8192)  # median, sigma, min, max
SYNTHETIC_OUTPUT = (100.0, 0.8, 1, 1024)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Python's datetime keeps 6 fractional digits; the 2023 traces carry 7.
_LONG_FRACTION = re.compile(r"(\.\d{6})\d+")
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


class WorkloadError(ValueError):
    """A user-facing problem with a workload spec, argument or trace file (one-line message)."""

    def __init__(self, message: str) -> None:
        # Callers print this as a single line in place of a traceback.
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


@dataclass(frozen=True, eq=False)
class Workload:
    """A replayable request sequence: arrival times and token lengths, split into labelled windows.

    The arrays are stored read-only so that one built workload can be shared by several simulator
    runs without one run corrupting the next. ``eq=False`` because element-wise array comparison
    has no single truth value; workloads compare by identity.
    """

    name: str
    arrivals: FloatArray
    prompt_lens: IntArray
    output_lens: IntArray
    windows: tuple[tuple[str, int, int], ...]
    description: str
    #: Prompts shortened to fit the profile's context limit (reported, never silent).
    capped_prompts: int = 0
    _window_starts: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        arrivals = _frozen(np.asarray(self.arrivals, dtype=np.float64))
        prompts = _frozen(np.asarray(self.prompt_lens, dtype=np.int64))
        outputs = _frozen(np.asarray(self.output_lens, dtype=np.int64))
        n = arrivals.shape[0] if arrivals.ndim == 1 else -1
        if n < 1 or prompts.shape != (n,) or outputs.shape != (n,):
            raise WorkloadError(
                f"workload {self.name!r}: arrivals, prompt_lens and output_lens must be 1-D arrays "
                f"of the same non-zero length (got shapes {arrivals.shape}, {prompts.shape}, "
                f"{outputs.shape})"
            )
        if arrivals[0] != 0.0 or not np.all(np.isfinite(arrivals)):
            raise WorkloadError(f"workload {self.name!r}: arrivals must be finite and start at 0.0")
        if np.any(np.diff(arrivals) < 0):
            raise WorkloadError(f"workload {self.name!r}: arrivals must be non-decreasing")
        if prompts.min() < 1 or outputs.min() < 1:
            raise WorkloadError(f"workload {self.name!r}: token lengths must be >= 1")
        windows = tuple((str(label), int(start), int(end)) for label, start, end in self.windows)
        expected_start = 0
        for label, start, end in windows:
            if start != expected_start or end <= start:
                raise WorkloadError(
                    f"workload {self.name!r}: window {label!r} [{start}, {end}) does not continue "
                    f"the previous window at {expected_start} or is empty"
                )
            expected_start = end
        if expected_start != n:
            raise WorkloadError(
                f"workload {self.name!r}: windows cover {expected_start} requests, not {n}"
            )
        object.__setattr__(self, "arrivals", arrivals)
        object.__setattr__(self, "prompt_lens", prompts)
        object.__setattr__(self, "output_lens", outputs)
        object.__setattr__(self, "windows", windows)
        object.__setattr__(self, "_window_starts", tuple(start for _, start, _ in windows))

    def __len__(self) -> int:
        return int(self.arrivals.shape[0])

    def head(self, count: int) -> Workload:
        """The first ``count`` requests (1 <= count <= len(self)), with the windows they fall in
        (a replay stopped part-way is measured over the requests it sent). ``capped_prompts``
        stays the whole workload's count: which prompts were cut is not kept."""
        if not 1 <= count <= len(self):
            raise WorkloadError(f"head: count must be in [1, {len(self)}], got {count}")
        if count == len(self):
            return self
        return Workload(
            name=self.name,
            arrivals=self.arrivals[:count],
            prompt_lens=self.prompt_lens[:count],
            output_lens=self.output_lens[:count],
            windows=tuple(_first_windows(self.windows, count)),
            description=f"{self.description} First {count:,} requests.".strip(),
            capped_prompts=self.capped_prompts,
        )

    def window_of(self, index: int) -> str:
        """Label of the window that holds request ``index`` (0 <= index < len(self))."""
        if not 0 <= index < len(self):
            raise IndexError(f"request index {index} out of range for {len(self)} requests")
        return self.windows[bisect.bisect_right(self._window_starts, index) - 1][0]


def _frozen(array: npt.NDArray[_Scalar]) -> npt.NDArray[_Scalar]:
    # Copy first: the caller may still hold (and later mutate) the array it passed in.
    out = np.array(array, copy=True)
    out.flags.writeable = False
    return out


# --------------------------------------------------------------------------------------------
# Trace files


def traces_dir() -> Path:
    """Folder that holds ``azure_llm_2023/``.

    ``$FLUIDPD_TRACES_DIR`` if set, else ``<repo root>/../shared/data/traces`` if it exists, else
    ``/work/shared/data/traces``.
    """
    env = os.environ.get(TRACES_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parents[2]
    sibling = repo_root.parent / "shared" / "data" / "traces"
    if sibling.is_dir():
        return sibling
    return _FALLBACK_TRACES_DIR


@dataclass(frozen=True)
class _Trace:
    """A parsed trace file: absolute UTC microseconds (sorted) and token lengths, read-only."""

    path: Path
    micros: IntArray
    prompts: IntArray
    outputs: IntArray

    def __len__(self) -> int:
        return int(self.micros.shape[0])


def _load_trace(path: str | os.PathLike[str]) -> _Trace:
    given = Path(path).expanduser()
    try:
        resolved = given.resolve()
        stat = resolved.stat()
    except FileNotFoundError:
        raise WorkloadError(f"{given}: no such trace file") from None
    except OSError as exc:
        raise WorkloadError(f"{given}: cannot read trace file: {exc.strerror or exc}") from None
    if resolved.is_dir():
        raise WorkloadError(f"{given}: is a directory, not a CSV trace file")
    # mtime and size are part of the key so that a file rewritten in place is parsed again.
    return _parse_trace_cached(resolved, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _parse_trace_cached(resolved: Path, mtime_ns: int, size: int) -> _Trace:
    del mtime_ns, size  # only part of the cache key
    micros: list[int] = []
    prompts: list[int] = []
    outputs: list[int] = []
    line = 1
    try:
        with resolved.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise WorkloadError(
                    f"{resolved}:1: empty file, expected header {','.join(_REQUIRED_COLUMNS)}"
                )
            names = [name.strip() for name in header]
            missing = [col for col in _REQUIRED_COLUMNS if col not in names]
            if missing:
                raise WorkloadError(
                    f"{resolved}:1: missing column(s) {', '.join(missing)} "
                    f"(header is {_clip(','.join(names))!r})"
                )
            i_time, i_prompt, i_output = (names.index(col) for col in _REQUIRED_COLUMNS)
            width = len(names)
            for row in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != width:
                    raise WorkloadError(
                        f"{resolved}:{line}: expected {width} fields, found {len(row)}"
                    )
                micros.append(_parse_timestamp(row[i_time], resolved, line))
                prompts.append(_parse_tokens(row[i_prompt], COL_PROMPT, resolved, line))
                outputs.append(_parse_tokens(row[i_output], COL_OUTPUT, resolved, line))
    except UnicodeDecodeError:
        raise WorkloadError(f"{resolved}:{line + 1}: not UTF-8 text") from None
    except csv.Error as exc:
        raise WorkloadError(f"{resolved}:{line + 1}: malformed CSV: {exc}") from None
    except OSError as exc:
        raise WorkloadError(f"{resolved}: cannot read trace file: {exc.strerror or exc}") from None
    if not micros:
        raise WorkloadError(f"{resolved}:1: no data rows after the header")
    times = np.array(micros, dtype=np.int64)
    # Stable, so rows that share a timestamp keep their file order.
    order = np.argsort(times, kind="stable")
    return _Trace(
        path=resolved,
        micros=_frozen(times[order]),
        prompts=_frozen(np.array(prompts, dtype=np.int64)[order]),
        outputs=_frozen(np.array(outputs, dtype=np.int64)[order]),
    )


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_timestamp(text: str, path: Path, line: int) -> int:
    cleaned = _LONG_FRACTION.sub(r"\1", text.strip())
    try:
        # fromisoformat takes any character between date and time; only ' ' and 'T' are sane.
        if len(cleaned) > 10 and cleaned[10] not in " T":
            raise ValueError(cleaned)
        stamp = datetime.fromisoformat(cleaned)
    except ValueError:
        raise WorkloadError(
            f"{path}:{line}: {COL_TIME} {_clip(text)!r} is not a timestamp "
            f"(expected e.g. 2023-11-16 18:17:03.9799600)"
        ) from None
    if stamp.tzinfo is None:
        # The 2023 traces have no zone; treating them as UTC keeps them comparable with the
        # offset-carrying 2024 format.
        stamp = stamp.replace(tzinfo=UTC)
    # Integer microseconds: float epoch seconds would lose sub-microsecond gaps' ordering.
    return (stamp - _EPOCH) // _MICROSECOND


def _parse_tokens(text: str, column: str, path: Path, line: int) -> int:
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise WorkloadError(f"{path}:{line}: {column} {_clip(text)!r} is not an integer")
    value = int(stripped)
    if value < 1:
        raise WorkloadError(f"{path}:{line}: {column} must be >= 1, got {value}")
    return value


def load_trace_csv(path: str | os.PathLike[str]) -> tuple[FloatArray, IntArray, IntArray]:
    """Parse an Azure-format trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens).

    Returns (seconds since the earliest row, prompt tokens, output tokens), sorted stably by time.
    The parse is cached per resolved path; the returned arrays are fresh copies. Raises
    :class:`WorkloadError` ``"<path>:<line>: <problem>"`` for a malformed file, and
    ``"<path>: no such trace file"`` when it does not exist.
    """
    trace = _load_trace(path)
    seconds = (trace.micros - trace.micros[0]).astype(np.float64) / 1e6
    return seconds, trace.prompts.copy(), trace.outputs.copy()


def _azure_trace(filename: str) -> _Trace:
    path = traces_dir() / _AZURE_SUBDIR / filename
    if not path.exists():
        raise WorkloadError(
            f"{path}: no such trace file (set {TRACES_ENV} to the folder that holds "
            f"{_AZURE_SUBDIR}/)"
        )
    return _load_trace(path)


# --------------------------------------------------------------------------------------------
# Workload construction


@dataclass
class _Draft:
    name: str
    arrivals: FloatArray
    prompts: IntArray
    outputs: IntArray
    windows: list[tuple[str, int, int]]
    notes: list[str]


def _scaled_native_arrivals(micros: IntArray, rps: float, source: str) -> tuple[FloatArray, float]:
    """Native arrival times rescaled so the mean rate ((n-1)/span) equals ``rps`` exactly.

    Returns the arrivals and the native mean rate.
    """
    seconds = (micros - micros[0]).astype(np.float64) / 1e6
    n = seconds.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.float64), 0.0
    span = float(seconds[-1])
    if span <= 0.0:
        raise WorkloadError(
            f"{source}: all {n} timestamps are equal, so there is no native rate to scale to "
            f"{rps:g} req/s"
        )
    native_rate = (n - 1) / span
    # Multiplying by (n-1)/(span*rps) in one step pins the last arrival at exactly (n-1)/rps.
    return seconds * ((n - 1) / (span * rps)), native_rate


def _resample(
    trace: _Trace, lo: int, count: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    picks = rng.integers(lo, len(trace), size=count)
    return trace.prompts[picks], trace.outputs[picks]


def _window_fill(
    trace: _Trace, lo: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray, int]:
    """Rows trace[lo:lo+WINDOW_SIZE] topped up to WINDOW_SIZE by resampling from trace[lo:]."""
    hi = min(len(trace), lo + WINDOW_SIZE)
    extra = WINDOW_SIZE - (hi - lo)
    more_p, more_o = _resample(trace, lo, extra, rng)
    prompts = np.concatenate((trace.prompts[lo:hi], more_p)).astype(np.int64)
    outputs = np.concatenate((trace.outputs[lo:hi], more_o)).astype(np.int64)
    return prompts, outputs, extra


def _build_staged(rps: float, seed: int, rng: np.random.Generator) -> _Draft:
    code = _azure_trace(_CODE_FILE)
    conv = _azure_trace(_CONV_FILE)
    if len(conv) <= WINDOW_SIZE:
        raise WorkloadError(
            f"{conv.path}: azure-staged needs more than {WINDOW_SIZE} conv rows, found {len(conv)}"
        )
    conv1_p, conv1_o = conv.prompts[:WINDOW_SIZE], conv.outputs[:WINDOW_SIZE]
    # Draw order (code top-up, conv top-up, arrival gaps) is fixed so that a seed is reproducible.
    code_p, code_o, code_extra = _window_fill(code, 0, rng)
    conv2_p, conv2_o, conv2_extra = _window_fill(conv, WINDOW_SIZE, rng)
    prompts = np.concatenate((conv1_p, code_p, conv2_p)).astype(np.int64)
    outputs = np.concatenate((conv1_o, code_o, conv2_o)).astype(np.int64)
    n = prompts.shape[0]
    arrivals = poisson_arrivals(n, rps, rng)
    code_rows = WINDOW_SIZE - code_extra
    conv2_rows = WINDOW_SIZE - conv2_extra
    note = (
        f"Azure (staged) from the 2023 Azure LLM inference traces: three consecutive "
        f"{WINDOW_SIZE:,}-request windows conv-1, code, conv-2. conv-1 = conv rows "
        f"[0:{WINDOW_SIZE}]; code = code rows [0:{code_rows}] in trace order plus {code_extra:,} "
        f"code rows resampled with replacement (seed {seed}); conv-2 = conv rows "
        f"[{WINDOW_SIZE}:{WINDOW_SIZE + conv2_rows}] plus {conv2_extra:,} rows resampled with "
        f"replacement from conv[{WINDOW_SIZE}:] (seed {seed}). Arrivals: one Poisson process at "
        f"{rps:g} req/s over all {n:,} requests, first arrival at 0 s."
    )
    windows = [
        ("conv-1", 0, WINDOW_SIZE),
        ("code", WINDOW_SIZE, 2 * WINDOW_SIZE),
        ("conv-2", 2 * WINDOW_SIZE, 3 * WINDOW_SIZE),
    ]
    return _Draft("azure-staged", arrivals, prompts, outputs, windows, [note])


def _gap_cv(micros: IntArray) -> float:
    gaps = np.diff(micros).astype(np.float64)
    mean = float(gaps.mean()) if gaps.size else 0.0
    return float(gaps.std()) / mean if mean > 0 else 0.0


def _build_mixed(rps: float) -> _Draft:
    code = _azure_trace(_CODE_FILE)
    conv = _azure_trace(_CONV_FILE)
    micros = np.concatenate((code.micros, conv.micros))
    order = np.argsort(micros, kind="stable")
    micros = micros[order]
    prompts = np.concatenate((code.prompts, conv.prompts))[order]
    outputs = np.concatenate((code.outputs, conv.outputs))[order]
    is_code = order < len(code)
    total = micros.shape[0]
    size = min(WINDOW_SIZE, total)
    starts = range(0, total - size + 1, MIXED_STEP)
    cvs = [_gap_cv(micros[s : s + size]) for s in starts]
    best = int(np.argmax(cvs))  # first maximum: earliest window wins ties
    lo = starts[best]
    hi = lo + size
    arrivals, native_rate = _scaled_native_arrivals(micros[lo:hi], rps, "azure-mixed")
    code_share = float(is_code[lo:hi].mean())
    note = (
        f"Azure (mixed) from the 2023 Azure LLM inference traces: code ({len(code):,} rows) and "
        f"conv ({len(conv):,} rows) merged by TIMESTAMP (stable, code first on ties, "
        f"{total:,} rows); of the {len(cvs)} windows of {size:,} requests starting every "
        f"{MIXED_STEP:,} rows, merged[{lo}:{hi}] (window #{best}, start index {lo}) has the "
        f"highest inter-arrival CV, {cvs[best]:.3f} (merged[0:{size}]: {cvs[0]:.3f}; lowest "
        f"{min(cvs):.3f}); it is {code_share:.1%} code. Native gaps scaled by native mean rate "
        f"{native_rate:.3f} req/s / target {rps:g} req/s so the burst shape is kept; first "
        f"arrival at 0 s."
    )
    return _Draft(
        "azure-mixed",
        arrivals,
        prompts[lo:hi].astype(np.int64),
        outputs[lo:hi].astype(np.int64),
        [("all", 0, size)],
        [note],
    )


def _build_synthetic(rps: float, seed: int, count: int, rng: np.random.Generator) -> _Draft:
    # Draw order (gaps, prompts, outputs) is fixed so that a seed is reproducible.
    arrivals = poisson_arrivals(count, rps, rng)
    prompts = lognormal_lengths(count, SYNTHETIC_PROMPT, rng)
    outputs = lognormal_lengths(count, SYNTHETIC_OUTPUT, rng)
    p_med, p_sigma, p_lo, p_hi = SYNTHETIC_PROMPT
    o_med, o_sigma, o_lo, o_hi = SYNTHETIC_OUTPUT
    note = (
        f"Synthetic: {count:,} requests with Poisson arrivals at {rps:g} req/s (first at 0 s); "
        f"prompt lengths lognormal with median {p_med:g} and sigma {p_sigma:g} clipped to "
        f"[{p_lo}, {p_hi}]; output lengths lognormal with median {o_med:g} and sigma {o_sigma:g} "
        f"clipped to [{o_lo}, {o_hi}]; seed {seed}."
    )
    return _Draft("synthetic", arrivals, prompts, outputs, [("all", 0, count)], [note])


def _build_csv(path: Path, rps: float) -> _Draft:
    trace = _load_trace(path)
    arrivals, native_rate = _scaled_native_arrivals(trace.micros, rps, str(trace.path))
    n = len(trace)
    note = (
        f"Trace file {trace.path}: all {n:,} rows in time order (stable sort); native gaps "
        f"scaled by native mean rate {native_rate:.3f} req/s / target {rps:g} req/s; first "
        f"arrival at 0 s."
    )
    return _Draft(
        path.stem,
        arrivals,
        trace.prompts.astype(np.int64),
        trace.outputs.astype(np.int64),
        [("all", 0, n)],
        [note],
    )


def _first_windows(
    windows: Iterable[tuple[str, int, int]], count: int
) -> list[tuple[str, int, int]]:
    """The windows of the first ``count`` requests, the last one cut at ``count``."""
    return [(label, s, min(e, count)) for label, s, e in windows if s < count]


def _truncate(draft: _Draft, count: int, spec: str) -> None:
    n = draft.arrivals.shape[0]
    if count > n:
        raise WorkloadError(
            f"num_requests={count} exceeds the {n:,} requests that workload {spec!r} has"
        )
    if count == n:
        return
    draft.arrivals = draft.arrivals[:count]
    draft.prompts = draft.prompts[:count]
    draft.outputs = draft.outputs[:count]
    draft.windows = _first_windows(draft.windows, count)
    draft.notes.append(f"Truncated to the first {count:,} requests.")


def _cap_context(draft: _Draft, context_limit: int) -> int:
    """Cap prompts at the context limit; returns how many were shortened."""
    room = np.maximum(context_limit - draft.outputs, 1)
    capped = int(np.count_nonzero(draft.prompts > room))
    draft.prompts = np.minimum(draft.prompts, room).astype(np.int64)
    draft.notes.append(
        f"Prompts capped at context_limit - output_len with context_limit={context_limit:,} "
        f"(at least 1 token): {capped:,} prompts shortened."
    )
    return capped


def _check_rps(rps: object) -> float:
    if isinstance(rps, bool) or not isinstance(rps, Real):
        raise WorkloadError(f"rps must be a number of requests per second, got {rps!r}")
    value = float(rps)
    if not (math.isfinite(value) and value > 0):
        raise WorkloadError(f"rps must be a finite number > 0, got {rps!r}")
    return value


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 1:
        raise WorkloadError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral) or int(seed) < 0:
        raise WorkloadError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _looks_like_path(spec: str) -> bool:
    return (
        spec.lower().endswith(".csv")
        or os.sep in spec
        or (os.altsep is not None and os.altsep in spec)
        or Path(spec).expanduser().is_file()
    )


def build_workload(
    spec: str | os.PathLike[str],
    rps: float,
    seed: int = 0,
    context_limit: int | None = None,
    num_requests: int | None = None,
) -> Workload:
    """Build a workload by name (one of :data:`WORKLOAD_NAMES`) or from an Azure-format CSV path.

    ``rps`` is the target mean request rate. ``num_requests`` keeps the first N requests (for
    ``synthetic`` it is the number drawn, default 2,000); asking for more than a trace-based
    workload has is an error. ``context_limit`` caps each prompt at
    ``context_limit - output_len`` (at least 1). See the module docstring for each construction.
    """
    rps_value = _check_rps(rps)
    seed_value = _check_seed(seed)
    count = None if num_requests is None else _check_positive_int("num_requests", num_requests)
    limit = None if context_limit is None else _check_positive_int("context_limit", context_limit)
    spec_text = os.fspath(spec)
    if not isinstance(spec_text, str) or not spec_text.strip():
        raise WorkloadError(
            f"workload must be one of {', '.join(WORKLOAD_NAMES)} or a CSV path, got {spec!r}"
        )
    rng = np.random.default_rng(seed_value)

    if spec_text == "azure-staged":
        draft = _build_staged(rps_value, seed_value, rng)
    elif spec_text == "azure-mixed":
        draft = _build_mixed(rps_value)
    elif spec_text == "synthetic":
        draft = _build_synthetic(rps_value, seed_value, count or SYNTHETIC_DEFAULT_REQUESTS, rng)
    elif spec_text in LONG_WORKLOAD_NAMES:
        arrivals, prompts, outputs, note = build_long(
            spec_text, rps_value, seed_value, count or LONG_DEFAULT_REQUESTS, rng
        )
        draft = _Draft(spec_text, arrivals, prompts, outputs, [("all", 0, len(prompts))], [note])
    elif _looks_like_path(spec_text):
        draft = _build_csv(Path(spec_text).expanduser(), rps_value)
    else:
        raise WorkloadError(
            f"unknown workload {spec_text!r}; expected one of {', '.join(WORKLOAD_NAMES)} or a "
            f"path to a CSV file with columns {','.join(_REQUIRED_COLUMNS)}"
        )

    if count is not None:
        _truncate(draft, count, spec_text)
    capped = 0
    if limit is not None:
        capped = _cap_context(draft, limit)
    return Workload(
        name=draft.name,
        arrivals=draft.arrivals,
        prompt_lens=draft.prompts,
        output_lens=draft.outputs,
        windows=tuple(draft.windows),
        description=" ".join(draft.notes),
        capped_prompts=capped,
    )
