"""The sim engine's timing model (``fluidpd.core.step_times``), which the simulator and the live
``sim`` engine both run: the profile's predicted times, times drift and mean-one noise."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.step_times import StepTimes
from fluidpd.core.types import Request
from tests.sidecar.helpers import fast_profile


def _prefill(tokens: int) -> PrefillBatch:
    return PrefillBatch(Request(1, 0.0, 512, 8), tokens, 0.0, 0.0)


def _decode(batch: int = 4, context: int = 2048, iterations: int = 1) -> DecodeBatch:
    stolen = Request(2, 0.0, 512, 8)
    stolen.stolen = 64
    return DecodeBatch(batch, context, [stolen], 0.0, 0.0, iterations)


def test_without_noise_a_step_takes_the_prediction_times_drift(tmp_path: Path) -> None:
    profile = fast_profile(tmp_path)
    times = StepTimes(profile, 0.0, 1.5, random.Random(0))
    predicted = profile.prefill_predictor().time(256)
    assert times.prefill(_prefill(256)) == pytest.approx(1.5 * predicted)
    suffix = profile.suffix_predictor().time(64)
    decode = profile.decode_predictor().time(4, 2048)
    assert times.decode(_decode()) == pytest.approx(1.5 * (decode + suffix))
    span = times.span(_decode(iterations=5), np.random.default_rng(0))
    expected = profile.decode_predictor().iteration_times(4, 2048, 5) * 1.5
    assert np.allclose(span, expected)


def test_an_empty_prefix_takes_no_time_and_draws_no_noise(tmp_path: Path) -> None:
    profile = fast_profile(tmp_path)
    a = StepTimes(profile, 0.3, 1.0, random.Random(7))
    b = StepTimes(profile, 0.3, 1.0, random.Random(7))
    assert a.prefill(_prefill(0)) == 0.0
    # The empty prefix left the stream where it was: both draw the same next factor.
    assert a.factor() == b.factor()


def test_noise_is_mean_one(tmp_path: Path) -> None:
    times = StepTimes(fast_profile(tmp_path), 0.5, 2.0, random.Random(1))
    factors = [times.factor() for _ in range(20_000)]
    assert np.mean(factors) == pytest.approx(2.0, rel=0.03)
    assert np.std(factors) > 0.5
