"""The step-time measurements behind `fluidpd profile`: how many runs a point takes, and what
each run measures."""

from __future__ import annotations

import pytest

from fluidpd_sidecar.gpu import profiler
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

OPTS = RunnerOptions(device="cpu", dtype="float32", kv_tokens=4096, max_context=512, max_batch=8)


class _Clockless:
    """A runner stand-in for _timed, which only calls sync()."""

    def sync(self) -> None:
        """Nothing to wait for: the timed functions run on the host."""


def _count_runs(
    grid: profiler.Grid, run_s: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, float]:
    """Runs ``_timed`` on a function that takes exactly ``run_s`` of a fake clock: a real sleep
    overshoots on a loaded machine (two 10 ms sleeps once took 0.1 s in CI)."""
    now = [0.0]
    calls: list[float] = []

    def fn() -> None:
        calls.append(now[0])
        now[0] += run_s

    monkeypatch.setattr("fluidpd_sidecar.gpu.profiler.time.perf_counter", lambda: now[0])
    median = profiler._timed(_Clockless(), fn, grid)  # type: ignore[arg-type]
    return len(calls) - 1, median  # less the warm-up


def test_a_point_takes_at_least_repeat_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runs, _ = _count_runs(profiler.Grid(repeat=7, min_time_s=0.0), 0.0, monkeypatch)
    assert runs == 7


def test_short_points_repeat_until_min_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs of 1/64 s against 1/8 s (sums exact in binary): eight of them, more than repeat.
    grid = profiler.Grid(repeat=2, min_time_s=0.125)
    runs, median = _count_runs(grid, 0.015625, monkeypatch)
    assert runs == 8
    assert median == 0.015625


def test_max_repeat_caps_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runs, _ = _count_runs(profiler.Grid(repeat=1, min_time_s=60.0, max_repeat=12), 0.0, monkeypatch)
    assert runs == 12


def test_every_decode_run_is_a_step_at_the_grid_context() -> None:
    runner = ModelRunner(SHAPES["tiny-llama"], OPTS)
    seen: list[tuple[int, ...]] = []
    decode = runner.decode

    def spy(rids: list[int], last: list[int]) -> list[int]:
        seen.append(tuple(runner.cache.lengths[r] for r in rids))
        return decode(rids, last)

    runner.decode = spy  # type: ignore[method-assign]
    grid = profiler.Grid(decode_batch=[2], decode_context=[32, 64], repeat=4, min_time_s=0.0)
    rows = profiler.measure_decode(runner, grid)
    assert [(r["batch"], r["context_per_request"]) for r in rows] == [(2, 32), (2, 64)]
    # 1 warm-up + 4 runs per point, each at the point's context, not one longer per run.
    assert seen == [(32, 32)] * 5 + [(64, 64)] * 5
    assert not runner.cache.lengths  # every request released
