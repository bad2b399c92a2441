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
from fluidpd.sim.simulator import prompt_normal
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


def _prompt(rid: int, tokens: int, reassigned: int = 0) -> PrefillBatch:
    req = Request(rid, 0.0, tokens, 8)
    req.reassigned = reassigned
    return PrefillBatch(req, tokens, 0.0, 0.0)


def test_keyed_prefill_noise_is_the_prompts_own(tmp_path: Path) -> None:
    # Common random numbers: with a key, a prompt's prefill time does not depend on what the
    # engine drew before it, so two policies replaying one workload see the same prompt take
    # the same time; another key or another dispatch of the prompt draws anew.
    profile = fast_profile(tmp_path)
    a = StepTimes(profile, 0.3, 1.0, random.Random(7), prompt_normal(5))
    b = StepTimes(profile, 0.3, 1.0, random.Random(8), prompt_normal(5))
    b.decode(_decode())
    b.prefill(_prompt(2, 256))
    assert a.prefill(_prompt(1, 256)) == b.prefill(_prompt(1, 256))
    # A shorter prefix (suffix stolen) of the same prompt keeps its factor.
    time = profile.prefill_predictor().time
    ratio = a.prefill(_prompt(1, 128)) / time(128)
    assert ratio == pytest.approx(a.prefill(_prompt(1, 256)) / time(256))
    other_key = StepTimes(profile, 0.3, 1.0, random.Random(7), prompt_normal(6))
    assert other_key.prefill(_prompt(1, 256)) != a.prefill(_prompt(1, 256))
    assert a.prefill(_prompt(1, 256, reassigned=1)) != a.prefill(_prompt(1, 256))
    # Unkeyed, the same prompt after another draw takes another time.
    c, d = (StepTimes(profile, 0.3, 1.0, random.Random(7)) for _ in range(2))
    d.decode(_decode())
    assert c.prefill(_prompt(1, 256)) != d.prefill(_prompt(1, 256))


def test_keyed_prefill_noise_is_mean_one_over_prompts(tmp_path: Path) -> None:
    profile = fast_profile(tmp_path)
    times = StepTimes(profile, 0.5, 2.0, random.Random(0), prompt_normal(3))
    base = profile.prefill_predictor().time(256)
    factors = [times.prefill(_prompt(rid, 256)) / base for rid in range(20_000)]
    assert np.mean(factors) == pytest.approx(2.0, rel=0.03)
    assert np.std(factors) > 0.5
