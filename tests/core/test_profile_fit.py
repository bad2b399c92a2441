"""The profile fit recovers known coefficients and keeps them non-negative."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluidpd.core.profile_fit import fit_decode, fit_quadratic, fit_suffix, fit_transfer


@given(
    c2=st.floats(0, 1e-8),
    c1=st.floats(1e-5, 1e-3),
    c0=st.floats(0, 0.05),
)
def test_quadratic_recovers_exact_coefficients(c2: float, c1: float, c0: float) -> None:
    t = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192], dtype=float)
    fit = fit_quadratic(t, c2 * t * t + c1 * t + c0)
    assert fit.mre < 1e-6
    assert all(c >= 0 for c in fit.coef)


@given(
    s2=st.floats(0, 1e-8),
    s1=st.floats(1e-6, 1e-3),
    s0=st.floats(0, 0.05),
    sp=st.floats(0, 1e-8),
)
def test_suffix_fit_recovers_the_prefix_term(s2: float, s1: float, s0: float, sp: float) -> None:
    """``fluidpd profile`` times suffixes after two prefixes; the fit separates their cost."""
    x = np.tile(np.array([64, 128, 256, 512, 1024, 2048], dtype=float), 2)
    p = np.repeat(np.array([512.0, 2048.0]), 6)
    fit = fit_suffix(x, p, s2 * x * x + s1 * x + s0 + sp * p * x)
    assert fit.mre < 1e-6
    assert all(c >= 0 for c in fit.coef) and len(fit.coef) == 4


def test_negative_intercept_is_dropped_not_kept() -> None:
    t = np.array([100, 200, 400, 800, 1600], dtype=float)
    y = 1e-4 * t - 2e-3  # a negative intercept fits best; the profile forbids it
    fit = fit_quadratic(t, y)
    assert fit.coef[2] == 0.0 and fit.coef[1] > 0


def test_decode_fit_and_relative_error() -> None:
    rng = np.random.default_rng(0)
    n = rng.integers(1, 128, 40).astype(float)
    c = n * rng.integers(128, 4096, 40)
    y = 2e-8 * c + 3e-5 * n + 5e-3
    fit = fit_decode(n, c, y * (1 + 0.02 * rng.standard_normal(40)))
    assert fit.mre < 0.05
    assert fit.coef[0] == pytest.approx(2e-8, rel=0.2)


def test_transfer_fit_gives_bandwidth() -> None:
    b = np.array([1e6, 1e7, 1e8, 1e9])
    fit = fit_transfer(b, b / 10e9 + 1e-3)
    assert 1 / fit.coef[0] == pytest.approx(10e9, rel=1e-6)


def test_bad_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        fit_quadratic(np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="at least"):
        fit_decode(np.array([1.0]), np.array([1.0]), np.array([1.0]))
