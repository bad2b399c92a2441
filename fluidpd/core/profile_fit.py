"""Fitting a profile's coefficients to measured step times (``fluidpd profile``).

Pure: measurements in, coefficients and errors out. The models are the profile's own
(eq. 2 prefill ``c2 L^2 + c1 L + c0``, the suffix ``s2 x^2 + s1 x + s0 + sp p x``, eq. 13 decode
``a_c C + a_n N + a_0``). The fit minimises squared *relative* error, because the metric the
paper reports (and the one the predictors are judged by) is the mean relative error, and a
plain least-squares fit lets the long prompts dominate and misses short ones by 50% or more.
Coefficients are non-negative (a negative c0 or c2 has no physical meaning and breaks the
inverse predictor of eq. 16): every subset of the optional terms is fitted and the best
non-negative one kept (at most four columns, one of them required, so at most eight
candidates).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Fit:
    coef: tuple[float, ...]
    mre: float
    max_re: float
    n: int


def mean_relative_error(pred: Array, meas: Array) -> tuple[float, float]:
    rel = np.abs(pred - meas) / meas
    return float(rel.mean()), float(rel.max())


def fit_nonnegative(x: Array, y: Array, required: tuple[int, ...]) -> Fit:
    """Min sum(((x @ c) - y) / y)^2 over c >= 0, with columns in ``required`` always kept.

    Raises:
        ValueError: fewer points than columns, non-positive times, or no feasible fit.
    """
    rows, cols = x.shape
    if rows < cols:
        raise ValueError(f"need at least {cols} measurements, got {rows}")
    if np.any(y <= 0):
        raise ValueError("measured times must be positive")
    w = 1.0 / y
    optional = [c for c in range(cols) if c not in required]
    best: tuple[float, Array] | None = None
    for k in range(len(optional) + 1):
        for extra in itertools.combinations(optional, k):
            use = sorted((*required, *extra))
            sol, *_ = np.linalg.lstsq(x[:, use] * w[:, None], y * w, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(cols)
            coef[use] = sol
            sse = float(np.sum(((x @ coef - y) * w) ** 2))
            if best is None or sse < best[0]:
                best = (sse, coef)
    if best is None:
        raise ValueError("no non-negative fit exists for these measurements")
    coef = best[1]
    mre, max_re = mean_relative_error(x @ coef, y)
    return Fit(tuple(float(c) for c in coef), mre, max_re, rows)


def fit_quadratic(tokens: Array, seconds: Array) -> Fit:
    """(c2, c1, c0) of ``c2 L^2 + c1 L + c0`` (prefill or suffix), in seconds."""
    t = np.asarray(tokens, dtype=np.float64)
    x = np.stack([t * t, t, np.ones_like(t)], axis=1)
    return fit_nonnegative(x, np.asarray(seconds, dtype=np.float64), required=(1,))


def fit_suffix(tokens: Array, prefix: Array, seconds: Array) -> Fit:
    """(s2, s1, s0, sp) of ``s2 x^2 + s1 x + s0 + sp p x``, in seconds: a suffix of x tokens
    extending a prefix of p (``SuffixPredictor``)."""
    x = np.asarray(tokens, dtype=np.float64)
    p = np.asarray(prefix, dtype=np.float64)
    cols = np.stack([x * x, x, np.ones_like(x), p * x], axis=1)
    return fit_nonnegative(cols, np.asarray(seconds, dtype=np.float64), required=(1,))


def fit_decode(batch: Array, context: Array, seconds: Array) -> Fit:
    """(a_c, a_n, a_0) of ``a_c C + a_n N + a_0``, in seconds."""
    n = np.asarray(batch, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    x = np.stack([c, n, np.ones_like(n)], axis=1)
    return fit_nonnegative(x, np.asarray(seconds, dtype=np.float64), required=(2,))


def fit_transfer(nbytes: Array, seconds: Array) -> Fit:
    """(seconds per byte, base seconds) of a hand-off."""
    b = np.asarray(nbytes, dtype=np.float64)
    x = np.stack([b, np.ones_like(b)], axis=1)
    return fit_nonnegative(x, np.asarray(seconds, dtype=np.float64), required=(0,))
