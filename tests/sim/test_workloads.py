"""Tests for fluidpd.sim.workloads: trace parsing, the three named workloads and CSV replay."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from fluidpd.sim import workloads
from fluidpd.sim.workloads import (
    WORKLOAD_NAMES,
    Workload,
    WorkloadError,
    build_workload,
    load_trace_csv,
    traces_dir,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure_file(name: str) -> Path:
    return traces_dir() / "azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv"


needs_traces = pytest.mark.skipif(
    not (_azure_file("code").is_file() and _azure_file("conv").is_file()),
    reason="Azure 2023 trace files are not available",
)


def _reference_rows(name: str) -> list[tuple[datetime, int, int]]:
    """Independent parse of an Azure trace with the csv module and datetime."""
    rows: list[tuple[datetime, int, int]] = []
    with _azure_file(name).open(newline="") as handle:
        for rec in csv.DictReader(handle):
            stamp = rec["TIMESTAMP"]
            head, _, frac = stamp.partition(".")
            rows.append(
                (
                    datetime.fromisoformat(f"{head}.{frac[:6]}"),
                    int(rec["ContextTokens"]),
                    int(rec["GeneratedTokens"]),
                )
            )
    return rows


@pytest.fixture(scope="module")
def code_rows() -> list[tuple[datetime, int, int]]:
    return _reference_rows("code")


@pytest.fixture(scope="module")
def conv_rows() -> list[tuple[datetime, int, int]]:
    return _reference_rows("conv")


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(text: str, name: str = "trace.csv") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write


def _assert_one_line_error(exc: pytest.ExceptionInfo[WorkloadError], *parts: str) -> str:
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


# --------------------------------------------------------------------------------------------
# traces_dir


def test_traces_dir_honours_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLUIDPD_TRACES_DIR", str(tmp_path))
    assert traces_dir() == tmp_path


def test_traces_dir_without_env_var_finds_shared_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLUIDPD_TRACES_DIR", raising=False)
    found = traces_dir()
    repo_sibling = Path(workloads.__file__).resolve().parents[2].parent / "shared/data/traces"
    expected = repo_sibling if repo_sibling.is_dir() else Path("/work/shared/data/traces")
    assert found == expected


def test_builtin_workload_with_missing_traces_names_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLUIDPD_TRACES_DIR", str(tmp_path))
    with pytest.raises(WorkloadError) as exc:
        build_workload("azure-mixed", rps=5)
    _assert_one_line_error(exc, str(tmp_path), "AzureLLMInferenceTrace_", "FLUIDPD_TRACES_DIR")


# --------------------------------------------------------------------------------------------
# load_trace_csv


def test_load_trace_csv_sorts_stably_and_parses_seven_digit_fractions(
    write_csv: Callable[..., Path],
) -> None:
    path = write_csv(
        HEADER + "2023-11-16 18:00:01.5000001,30,3\n"
        "2023-11-16 18:00:00.2500000,10,1\n"
        "2023-11-16 18:00:01.5000009,20,2\n"  # same microsecond as row 1 once trimmed
        "2023-11-16 18:00:03.0000000,40,4\n"
    )
    seconds, prompts, outputs = load_trace_csv(path)
    assert seconds.dtype == np.float64
    assert prompts.dtype == np.int64
    assert outputs.dtype == np.int64
    np.testing.assert_allclose(seconds, [0.0, 1.25, 1.25, 2.75])
    # The two rows tied at 1.5 s keep their file order (30 before 20).
    assert prompts.tolist() == [10, 30, 20, 40]
    assert outputs.tolist() == [1, 3, 2, 4]


def test_load_trace_csv_accepts_utc_offsets_and_extra_columns(
    write_csv: Callable[..., Path],
) -> None:
    path = write_csv(
        "Extra,TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "a,2024-05-10 00:00:00+00:00,5,6\n"
        "b,2024-05-10 00:00:00.500000+00:00,7,8\n"
    )
    seconds, prompts, outputs = load_trace_csv(path)
    np.testing.assert_allclose(seconds, [0.0, 0.5])
    assert prompts.tolist() == [5, 7]
    assert outputs.tolist() == [6, 8]


def test_load_trace_csv_returns_copies_not_the_cache(write_csv: Callable[..., Path]) -> None:
    path = write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n2023-11-16 18:00:01.0,20,2\n")
    _, prompts, _ = load_trace_csv(path)
    prompts[0] = 999
    assert load_trace_csv(path)[1].tolist() == [10, 20]


def test_load_trace_csv_rereads_a_rewritten_file(write_csv: Callable[..., Path]) -> None:
    path = write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n")
    assert load_trace_csv(path)[1].tolist() == [10]
    write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n2023-11-16 18:00:02.0,12,3\n")
    assert load_trace_csv(path)[1].tolist() == [10, 12]


@needs_traces
def test_load_trace_csv_matches_reference_parse(
    code_rows: list[tuple[datetime, int, int]],
) -> None:
    seconds, prompts, outputs = load_trace_csv(_azure_file("code"))
    assert len(seconds) == len(code_rows) == 8819
    assert prompts.tolist() == [p for _, p, _ in code_rows]
    assert outputs.tolist() == [o for _, _, o in code_rows]
    first = code_rows[0][0]
    expected = [(t - first).total_seconds() for t, _, _ in code_rows]
    np.testing.assert_allclose(seconds, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.0,10\n", 1, "GeneratedTokens"),
        (HEADER + "2023-11-16 18:00:00.0,10,1\nyesterday,10,1\n", 3, "TIMESTAMP"),
        (HEADER + "2023-11-16 18:00:00.0,10,1\n2023-11-16 18:00:01.0,12.5,1\n", 3, "ContextTokens"),
        (HEADER + "2023-11-16 18:00:00.0,abc,1\n", 2, "ContextTokens"),
        (HEADER + "2023-11-16 18:00:00.0,10,0\n", 2, "GeneratedTokens"),
        (HEADER + "2023-11-16 18:00:00.0,0,4\n", 2, "ContextTokens"),
        (HEADER + "2023-11-16 18:00:00.0,-3,4\n", 2, "ContextTokens"),
        (HEADER + "2023-11-16 18:00:00.0,10,1,7\n", 2, "fields"),
        (HEADER, 1, "no data rows"),
        ("", 1, "empty file"),
    ],
    ids=[
        "missing-column",
        "bad-timestamp",
        "non-integer-token",
        "word-token",
        "zero-output",
        "zero-prompt",
        "negative-prompt",
        "extra-field",
        "header-only",
        "empty-file",
    ],
)
def test_load_trace_csv_reports_path_and_line(
    write_csv: Callable[..., Path], body: str, line: int, fragment: str
) -> None:
    path = write_csv(body)
    with pytest.raises(WorkloadError) as exc:
        load_trace_csv(path)
    message = _assert_one_line_error(exc, fragment)
    assert message.startswith(f"{path.resolve()}:{line}: ")


def test_load_trace_csv_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(WorkloadError) as exc:
        load_trace_csv(missing)
    _assert_one_line_error(exc, str(missing), "no such trace file")


def test_load_trace_csv_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as exc:
        load_trace_csv(tmp_path)
    _assert_one_line_error(exc, str(tmp_path), "directory")


def test_bad_value_with_newline_stays_one_line(write_csv: Callable[..., Path]) -> None:
    path = write_csv(HEADER + '"2023-11-16\n18:00",10,1\n')
    with pytest.raises(WorkloadError) as exc:
        load_trace_csv(path)
    _assert_one_line_error(exc, "TIMESTAMP")


# --------------------------------------------------------------------------------------------
# azure-staged


@needs_traces
def test_staged_windows_and_composition(
    code_rows: list[tuple[datetime, int, int]], conv_rows: list[tuple[datetime, int, int]]
) -> None:
    w = build_workload("azure-staged", rps=40, seed=3)
    assert w.name == "azure-staged"
    assert len(w) == 30_000
    assert w.windows == (
        ("conv-1", 0, 10_000),
        ("code", 10_000, 20_000),
        ("conv-2", 20_000, 30_000),
    )
    assert [w.window_of(i) for i in (0, 9_999, 10_000, 19_999, 20_000, 29_999)] == [
        "conv-1",
        "conv-1",
        "code",
        "code",
        "conv-2",
        "conv-2",
    ]
    pairs = list(zip(w.prompt_lens.tolist(), w.output_lens.tolist(), strict=True))
    conv_pairs = [(p, o) for _, p, o in conv_rows]
    code_pairs = [(p, o) for _, p, o in code_rows]
    assert len(code_pairs) == 8_819
    assert len(conv_pairs) == 19_366

    assert pairs[:10_000] == conv_pairs[:10_000]
    assert pairs[10_000:18_819] == code_pairs
    assert set(pairs[18_819:20_000]) <= set(code_pairs)
    assert pairs[20_000:29_366] == conv_pairs[10_000:]
    assert set(pairs[29_366:]) <= set(conv_pairs[10_000:])
    assert "1,181" in w.description
    assert "634" in w.description


@needs_traces
def test_staged_arrivals_are_poisson_at_target_rate() -> None:
    rps = 40.0
    w = build_workload("azure-staged", rps=rps, seed=1)
    assert w.arrivals.dtype == np.float64
    assert w.arrivals[0] == 0.0
    gaps = np.diff(w.arrivals)
    assert np.all(gaps >= 0)
    # 29,999 exponential gaps: the mean is within 3 % with overwhelming probability.
    assert (len(w) - 1) / w.arrivals[-1] == pytest.approx(rps, rel=0.03)
    # Exponential gaps have CV 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@needs_traces
def test_staged_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    a = build_workload("azure-staged", rps=40, seed=7)
    b = build_workload("azure-staged", rps=40, seed=7)
    c = build_workload("azure-staged", rps=40, seed=8)
    np.testing.assert_array_equal(a.arrivals, b.arrivals)
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)
    np.testing.assert_array_equal(a.output_lens, b.output_lens)
    assert a.description == b.description
    assert not np.array_equal(a.arrivals, c.arrivals)
    # Only the resampled tails depend on the seed.
    assert not np.array_equal(a.prompt_lens[18_819:20_000], c.prompt_lens[18_819:20_000])
    np.testing.assert_array_equal(a.prompt_lens[:18_819], c.prompt_lens[:18_819])


# --------------------------------------------------------------------------------------------
# azure-mixed


@needs_traces
def test_mixed_picks_burstiest_window_and_scales_gaps(
    code_rows: list[tuple[datetime, int, int]], conv_rows: list[tuple[datetime, int, int]]
) -> None:
    # Reference: stable merge with code first on equal timestamps, 10K windows every 1K rows.
    merged = sorted(code_rows + conv_rows, key=lambda row: row[0])
    origin = merged[0][0]
    seconds = np.array([(t - origin).total_seconds() for t, _, _ in merged])
    cvs = []
    for start in range(0, len(merged) - 10_000 + 1, 1_000):
        gaps = np.diff(seconds[start : start + 10_000])
        cvs.append(gaps.std() / gaps.mean())
    best = int(np.argmax(cvs)) * 1_000
    window = merged[best : best + 10_000]

    rps = 12.5
    w = build_workload("azure-mixed", rps=rps)
    assert w.name == "azure-mixed"
    assert len(w) == 10_000
    assert w.windows == (("all", 0, 10_000),)
    assert w.window_of(9_999) == "all"
    assert w.prompt_lens.tolist() == [p for _, p, _ in window]
    assert w.output_lens.tolist() == [o for _, _, o in window]
    assert f"start index {best}" in w.description
    assert f"{max(cvs):.3f}" in w.description

    assert w.arrivals[0] == 0.0
    assert np.all(np.diff(w.arrivals) >= 0)
    mean_rate = (len(w) - 1) / w.arrivals[-1]
    assert mean_rate == pytest.approx(rps, rel=0.01)
    # Every gap is the native gap times one common factor: the burst shape is preserved.
    native = seconds[best : best + 10_000] - seconds[best]
    native_rate = (len(native) - 1) / native[-1]
    np.testing.assert_allclose(w.arrivals, native * native_rate / rps, rtol=1e-9, atol=1e-6)
    gaps = np.diff(w.arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(max(cvs), rel=1e-6)


@needs_traces
def test_mixed_rate_change_only_rescales_time() -> None:
    slow = build_workload("azure-mixed", rps=5)
    fast = build_workload("azure-mixed", rps=20)
    np.testing.assert_allclose(fast.arrivals * 4, slow.arrivals, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(fast.prompt_lens, slow.prompt_lens)


# --------------------------------------------------------------------------------------------
# synthetic


def test_synthetic_shape_and_distributions() -> None:
    w = build_workload("synthetic", rps=10, seed=0)
    assert w.name == "synthetic"
    assert len(w) == 2_000
    assert w.windows == (("all", 0, 2_000),)
    assert w.arrivals[0] == 0.0
    assert np.all(np.diff(w.arrivals) >= 0)
    assert (len(w) - 1) / w.arrivals[-1] == pytest.approx(10, rel=0.1)
    assert w.prompt_lens.min() >= 16
    assert w.prompt_lens.max() <= 8192
    assert w.output_lens.min() >= 1
    assert w.output_lens.max() <= 1024
    assert np.median(w.prompt_lens) == pytest.approx(1000, rel=0.1)
    assert np.median(w.output_lens) == pytest.approx(100, rel=0.1)
    log_prompts = np.log(w.prompt_lens)
    assert log_prompts.std() == pytest.approx(0.8, rel=0.1)


def test_synthetic_num_requests_sets_count_and_seed_determinism() -> None:
    a = build_workload("synthetic", rps=3, seed=5, num_requests=500)
    b = build_workload("synthetic", rps=3, seed=5, num_requests=500)
    c = build_workload("synthetic", rps=3, seed=6, num_requests=500)
    assert len(a) == 500
    assert a.windows == (("all", 0, 500),)
    np.testing.assert_array_equal(a.arrivals, b.arrivals)
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)
    np.testing.assert_array_equal(a.output_lens, b.output_lens)
    assert not np.array_equal(a.arrivals, c.arrivals)
    assert not np.array_equal(a.prompt_lens, c.prompt_lens)
    assert len(build_workload("synthetic", rps=3, num_requests=5_000)) == 5_000


# --------------------------------------------------------------------------------------------
# CSV path


def test_csv_path_replays_all_rows_with_scaled_gaps(write_csv: Callable[..., Path]) -> None:
    path = write_csv(
        HEADER + "2023-11-16 18:00:04.0,40,4\n"
        "2023-11-16 18:00:00.0,10,1\n"
        "2023-11-16 18:00:01.0,20,2\n"
        "2023-11-16 18:00:01.0,30,3\n",
        name="tiny_trace.csv",
    )
    # Native: 3 gaps over 4 s = 0.75 req/s; at 3 req/s time shrinks by 4x.
    w = build_workload(str(path), rps=3.0)
    assert w.name == "tiny_trace"
    assert w.windows == (("all", 0, 4),)
    np.testing.assert_allclose(w.arrivals, [0.0, 0.25, 0.25, 1.0])
    assert w.prompt_lens.tolist() == [10, 20, 30, 40]
    assert w.output_lens.tolist() == [1, 2, 3, 4]
    assert (len(w) - 1) / w.arrivals[-1] == pytest.approx(3.0)
    assert build_workload(path, rps=3.0).prompt_lens.tolist() == [10, 20, 30, 40]


def test_csv_single_row_and_zero_span(write_csv: Callable[..., Path]) -> None:
    one = write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n", name="one.csv")
    w = build_workload(str(one), rps=1)
    assert w.arrivals.tolist() == [0.0]
    same = write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n" * 3, name="same.csv")
    with pytest.raises(WorkloadError) as exc:
        build_workload(str(same), rps=1)
    _assert_one_line_error(exc, "same.csv", "timestamps are equal")


def test_csv_spec_errors_carry_path_and_line(write_csv: Callable[..., Path]) -> None:
    path = write_csv(HEADER + "2023-11-16 18:00:00.0,10,1\n2023-11-16 18:00:01.0,ten,1\n")
    with pytest.raises(WorkloadError) as exc:
        build_workload(str(path), rps=2)
    assert str(exc.value).startswith(f"{path.resolve()}:3: ContextTokens")
    with pytest.raises(WorkloadError) as missing:
        build_workload(str(path.with_name("absent.csv")), rps=2)
    _assert_one_line_error(missing, "absent.csv", "no such trace file")


# --------------------------------------------------------------------------------------------
# num_requests and context_limit


@needs_traces
def test_num_requests_truncates_and_drops_empty_windows() -> None:
    full = build_workload("azure-staged", rps=40, seed=2)
    part = build_workload("azure-staged", rps=40, seed=2, num_requests=15_000)
    assert len(part) == 15_000
    assert part.windows == (("conv-1", 0, 10_000), ("code", 10_000, 15_000))
    np.testing.assert_array_equal(part.arrivals, full.arrivals[:15_000])
    np.testing.assert_array_equal(part.prompt_lens, full.prompt_lens[:15_000])
    np.testing.assert_array_equal(part.output_lens, full.output_lens[:15_000])
    assert "first 15,000" in part.description

    exact = build_workload("azure-staged", rps=40, seed=2, num_requests=10_000)
    assert exact.windows == (("conv-1", 0, 10_000),)
    small = build_workload("azure-mixed", rps=10, num_requests=7)
    assert len(small) == 7
    assert small.windows == (("all", 0, 7),)
    with pytest.raises(IndexError):
        small.window_of(7)


@needs_traces
def test_num_requests_beyond_workload_is_an_error() -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("azure-mixed", rps=10, num_requests=10_001)
    _assert_one_line_error(exc, "num_requests=10001", "10,000")


def test_context_limit_caps_prompts() -> None:
    limit = 1_200
    base = build_workload("synthetic", rps=10, seed=4)
    capped = build_workload("synthetic", rps=10, seed=4, context_limit=limit)
    np.testing.assert_array_equal(capped.output_lens, base.output_lens)
    np.testing.assert_array_equal(capped.arrivals, base.arrivals)
    room = np.maximum(limit - base.output_lens, 1)
    np.testing.assert_array_equal(capped.prompt_lens, np.minimum(base.prompt_lens, room))
    fits = base.output_lens < limit
    assert np.all(capped.prompt_lens[fits] + capped.output_lens[fits] <= limit)
    assert capped.prompt_lens.min() >= 1
    changed = int(np.count_nonzero(capped.prompt_lens != base.prompt_lens))
    assert changed > 0
    assert f"{changed:,} prompts shortened" in capped.description


def test_context_limit_smaller_than_output_leaves_one_prompt_token(
    write_csv: Callable[..., Path],
) -> None:
    path = write_csv(HEADER + "2023-11-16 18:00:00.0,500,50\n2023-11-16 18:00:01.0,500,5\n")
    w = build_workload(str(path), rps=1, context_limit=40)
    assert w.prompt_lens.tolist() == [1, 35]


@needs_traces
def test_context_limit_on_staged_keeps_requests_in_budget() -> None:
    w = build_workload("azure-staged", rps=40, context_limit=8_192)
    assert int((w.prompt_lens + w.output_lens).max()) <= 8_192


# --------------------------------------------------------------------------------------------
# argument errors


def test_unknown_workload_lists_valid_names() -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("azure-mixd", rps=10)
    _assert_one_line_error(exc, "azure-mixd", *WORKLOAD_NAMES)


@pytest.mark.parametrize("rps", [0, -1.0, math.nan, math.inf, "10", True, None])
def test_bad_rps(rps: object) -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("synthetic", rps=rps)  # type: ignore[arg-type]
    _assert_one_line_error(exc, "rps")


@pytest.mark.parametrize("num_requests", [0, -5, 1.5, True, "100"])
def test_bad_num_requests(num_requests: object) -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("synthetic", rps=1, num_requests=num_requests)  # type: ignore[arg-type]
    _assert_one_line_error(exc, "num_requests", "positive integer")


@pytest.mark.parametrize("context_limit", [0, -10, 2.5])
def test_bad_context_limit(context_limit: object) -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("synthetic", rps=1, context_limit=context_limit)  # type: ignore[arg-type]
    _assert_one_line_error(exc, "context_limit")


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(WorkloadError) as exc:
        build_workload("synthetic", rps=1, seed=seed)  # type: ignore[arg-type]
    _assert_one_line_error(exc, "seed")


def test_workload_error_is_a_value_error() -> None:
    assert issubclass(WorkloadError, ValueError)


# --------------------------------------------------------------------------------------------
# Workload invariants and performance


def test_workload_arrays_are_read_only_copies() -> None:
    arrivals = np.array([0.0, 1.0])
    w = Workload("t", arrivals, np.array([3, 4]), np.array([1, 2]), (("all", 0, 2),), "test")
    arrivals[1] = 5.0
    assert w.arrivals.tolist() == [0.0, 1.0]
    assert w.prompt_lens.dtype == np.int64
    with pytest.raises(ValueError):
        w.arrivals[0] = 1.0
    assert len(w) == 2


@pytest.mark.parametrize(
    ("arrivals", "windows"),
    [
        ([0.0, 1.0], (("all", 0, 1),)),  # windows do not cover every request
        ([0.0, 1.0], (("a", 0, 1), ("b", 0, 2))),  # windows overlap
        ([1.0, 2.0], (("all", 0, 2),)),  # first arrival not at 0
        ([0.0, -1.0], (("all", 0, 2),)),  # decreasing
    ],
)
def test_workload_rejects_inconsistent_fields(
    arrivals: list[float], windows: tuple[tuple[str, int, int], ...]
) -> None:
    with pytest.raises(WorkloadError):
        Workload("t", np.array(arrivals), np.array([1, 1]), np.array([1, 1]), windows, "")


@needs_traces
def test_each_azure_trace_is_parsed_once_for_every_workload_built_from_it() -> None:
    # How fast a cold build is belongs to `fluidpd bench`, not to a timed assert here: what a
    # test can hold is that a sweep's many builds reuse one parse of each trace file.
    workloads._parse_trace_cached.cache_clear()
    first = build_workload("azure-staged", rps=40)
    build_workload("azure-mixed", rps=10)
    parsed = workloads._parse_trace_cached.cache_info().misses
    again = build_workload("azure-staged", rps=40)
    build_workload("azure-mixed", rps=20)
    info = workloads._parse_trace_cached.cache_info()
    assert info.misses == parsed and info.hits >= 2
    assert np.array_equal(first.arrivals, again.arrivals)


def test_head_keeps_the_first_requests_and_the_windows_they_fall_in() -> None:
    w = Workload(
        "w",
        np.arange(6, dtype=np.float64),
        np.array([5, 6, 7, 8, 9, 10]),
        np.array([1, 2, 3, 4, 5, 6]),
        (("a", 0, 2), ("b", 2, 4), ("c", 4, 6)),
        "six requests",
    )
    h = w.head(3)
    assert len(h) == 3 and h.arrivals.tolist() == [0.0, 1.0, 2.0]
    assert h.prompt_lens.tolist() == [5, 6, 7] and h.output_lens.tolist() == [1, 2, 3]
    assert h.windows == (("a", 0, 2), ("b", 2, 3))
    assert w.head(6) is w
    for bad in (0, 7):
        with pytest.raises(WorkloadError, match="head: count"):
            w.head(bad)
