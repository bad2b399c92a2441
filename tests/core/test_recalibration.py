"""Online recalibration: OnlineCalibrator fed noisy step times from a drifted engine.

The engine runs 1.3x slower than the offline profile says (every coefficient scaled); the
calibrator sees step times with mean-one log-normal noise (sigma 0.5%) and must converge to
within 5% of the drifted coefficients. Seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import fluidpd
from fluidpd.core.predictors import (
    DecodeIterPredictor,
    OnlineCalibrator,
    PrefillPredictor,
    SuffixPredictor,
)
from fluidpd.core.types import SLO, Role
from fluidpd.profiles import load_profile_file
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, Simulator
from fluidpd.sim.workloads import build_workload

PROFILE = load_profile_file(
    Path(fluidpd.__file__).resolve().parent.parent / "profiles" / "llama-3.1-8b-a100-80gb.yaml"
)
DRIFT = 1.3
SEEDS = [0, 1, 2, 3]


def drifted_prefill(p: PrefillPredictor) -> PrefillPredictor:
    return PrefillPredictor(c1=p.c1 * DRIFT, c0=p.c0 * DRIFT, c2=p.c2 * DRIFT)


def drifted_suffix(s: SuffixPredictor) -> SuffixPredictor:
    return SuffixPredictor(s1=s.s1 * DRIFT, s0=s.s0 * DRIFT, s2=s.s2 * DRIFT, sp=s.sp * DRIFT)


def drifted_decode(d: DecodeIterPredictor) -> DecodeIterPredictor:
    return DecodeIterPredictor(a_c=d.a_c * DRIFT, a_n=d.a_n * DRIFT, a_0=d.a_0 * DRIFT)


def noise(rng: np.random.Generator, sigma: float) -> float:
    return float(np.exp(rng.normal(0.0, sigma) - 0.5 * sigma * sigma))


def rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_prefill_converges_to_drifted(seed: int) -> None:
    pre = PROFILE.prefill_predictor()
    true = drifted_prefill(pre)
    cal = OnlineCalibrator(pre, PROFILE.suffix_predictor(), PROFILE.decode_predictor())
    rng = np.random.default_rng(seed)
    for _ in range(3000):
        tokens = int(rng.integers(64, 8192))
        got = cal.observe_prefill(tokens, true.time(tokens) * noise(rng, 0.005))
    assert got is cal.prefill
    assert rel(got.c1, true.c1) < 0.05
    assert rel(got.c0, true.c0) < 0.05
    assert rel(got.c2, true.c2) < 0.05
    # Far from the offline profile it started from.
    assert rel(got.c1, pre.c1) > 0.2


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_converges_to_drifted(seed: int) -> None:
    dec = PROFILE.decode_predictor()
    true = drifted_decode(dec)
    cal = OnlineCalibrator(PROFILE.prefill_predictor(), PROFILE.suffix_predictor(), dec)
    rng = np.random.default_rng(seed)
    for _ in range(3000):
        batch = int(rng.integers(1, 512))
        context = int(rng.integers(100, 4000)) * batch
        got = cal.observe_decode(batch, context, true.time(batch, context) * noise(rng, 0.005))
    assert rel(got.a_c, true.a_c) < 0.05
    assert rel(got.a_n, true.a_n) < 0.05
    assert rel(got.a_0, true.a_0) < 0.05
    assert rel(got.a_0, dec.a_0) > 0.2


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_suffix_converges_to_drifted(seed: int) -> None:
    """With a linear suffix model (s2 = 0) the suffix refit converges like the others."""
    sfx = replace(PROFILE.suffix_predictor(), s2=0.0)
    true = drifted_suffix(sfx)
    cal = OnlineCalibrator(PROFILE.prefill_predictor(), sfx, PROFILE.decode_predictor())
    rng = np.random.default_rng(seed)
    for _ in range(3000):
        tokens = int(rng.integers(16, 4096))
        got = cal.observe_suffix(tokens, true.time(tokens) * noise(rng, 0.005))
    assert rel(got.s1, true.s1) < 0.05
    assert rel(got.s0, true.s0) < 0.05
    # The quadratic term is refitted too; for a linear truth it must stay negligible.
    assert got.s2 * 4096**2 < 0.02 * true.time(4096)


def test_quadratic_suffix_converges_to_drifted() -> None:
    sfx = PROFILE.suffix_predictor()
    assert sfx.s2 > 0
    true = drifted_suffix(sfx)
    cal = OnlineCalibrator(PROFILE.prefill_predictor(), sfx, PROFILE.decode_predictor())
    rng = np.random.default_rng(0)
    for _ in range(3000):
        tokens = int(rng.integers(16, 4096))
        got = cal.observe_suffix(tokens, true.time(tokens))  # no noise at all
    for x in (128, 1024, 4096):
        assert rel(got.time(x), true.time(x)) < 0.05, x
    assert rel(got.s1, true.s1) < 0.05
    assert rel(got.s0, true.s0) < 0.05
    assert rel(got.s2, true.s2) < 0.05


def test_suffix_refit_learns_the_cost_of_the_prefix_it_extends() -> None:
    """Extends after prefixes of 0-16K tokens: the refit finds the prefix term (the offline
    profile's, drifted) and predicts long-context suffixes within 5%."""
    sfx = PROFILE.suffix_predictor()
    assert sfx.sp > 0
    true = drifted_suffix(sfx)
    cal = OnlineCalibrator(PROFILE.prefill_predictor(), sfx, PROFILE.decode_predictor())
    rng = np.random.default_rng(0)
    for _ in range(3000):
        tokens, prefix = int(rng.integers(16, 4096)), int(rng.integers(0, 16384))
        got = cal.observe_suffix(tokens, true.time(tokens, prefix) * noise(rng, 0.005), prefix)
    assert rel(got.sp, true.sp) < 0.05
    for x, p in ((128, 0), (1024, 8192), (4096, 16384)):
        assert rel(got.time(x, p), true.time(x, p)) < 0.05, (x, p)


def test_offline_coefficients_until_min_samples() -> None:
    pre, sfx, dec = (
        PROFILE.prefill_predictor(),
        PROFILE.suffix_predictor(),
        PROFILE.decode_predictor(),
    )
    cal = OnlineCalibrator(pre, sfx, dec, min_samples=20)
    true = drifted_prefill(pre)
    for i in range(19):
        tokens = 500 + 100 * i
        assert cal.observe_prefill(tokens, true.time(tokens)) == pre
    assert cal.observe_prefill(3000, true.time(3000)) != pre


def test_refit_is_clamped_to_physical_range() -> None:
    """Garbage observations (negative times) never make a predictor invalid."""
    pre, sfx, dec = (
        PROFILE.prefill_predictor(),
        PROFILE.suffix_predictor(),
        PROFILE.decode_predictor(),
    )
    cal = OnlineCalibrator(pre, sfx, dec, min_samples=1)
    rng = np.random.default_rng(0)
    for _ in range(200):
        tokens = int(rng.integers(1, 4000))
        p = cal.observe_prefill(tokens, -1.0)
        s = cal.observe_suffix(tokens, -1.0)
        d = cal.observe_decode(int(rng.integers(1, 64)), tokens * 10, -1.0)
        assert p.c1 > 0 and p.c0 >= 0 and p.c2 >= 0
        assert s.s1 > 0 and s.s0 >= 0
        assert d.a_0 > 0 and d.a_c >= 0 and d.a_n >= 0


def test_adaptive_workers_track_a_drifted_engine_in_the_simulator() -> None:
    """End to end: the simulated engine is 1.3x slower than the profile; adaptive workers'
    predictors end up predicting the engine's true step times within 5%."""
    wl = build_workload("synthetic", 8.0, seed=1, num_requests=400)
    cfg = SimConfig(
        PROFILE,
        SLO(ttft=2.0, tpot=0.1),
        2,
        2,
        mechanisms=MECHANISMS["static"],
        noise=0.01,
        drift=DRIFT,
        adaptive=True,
        seed=1,
    )
    sim = Simulator(wl, cfg)
    sim.run()
    pre, dec = PROFILE.prefill_predictor(), PROFILE.decode_predictor()
    seen = set()
    for w in sim.workers.values():
        if w.role is Role.PREFILL:
            seen.add(Role.PREFILL)
            for tokens in (256, 1024, 4096):
                assert rel(w.prefill.prefill.time(tokens), DRIFT * pre.time(tokens)) < 0.05
        else:
            seen.add(Role.DECODE)
            for batch, ctx in ((1, 500), (16, 1500), (64, 2000)):
                got = w.decode.decode.time(batch, batch * ctx)
                assert rel(got, DRIFT * dec.time(batch, batch * ctx)) < 0.05
    assert seen == {Role.PREFILL, Role.DECODE}
