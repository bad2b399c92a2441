"""Latency predictors (paper eqs. 2, 13, 16) and their online recalibration.

All times are seconds. The paper calibrates linear models offline per model x GPU (§V-G); we
also offer an optional quadratic term for long prompts (attention grows with L^2) and online
recalibration by recursive least squares, the paper's stated next step (§V-A).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import overload

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PrefillPredictor:
    """T_pre(L) = c2 L^2 + c1 L + c0 (eq. 2; c2 = 0 is the paper's linear model)."""

    c1: float
    c0: float
    c2: float = 0.0

    def __post_init__(self) -> None:
        if not (self.c1 > 0 and self.c0 >= 0 and self.c2 >= 0):
            raise ValueError("prefill predictor needs c1 > 0, c0 >= 0, c2 >= 0")

    @overload
    def time(self, length: float) -> float: ...
    @overload
    def time(self, length: FloatArray) -> FloatArray: ...
    def time(self, length: float | FloatArray) -> float | FloatArray:
        """Predicted prefill latency of a prompt (or prefix) of ``length`` tokens, eq. (2).

        Works on scalars and on numpy arrays. The value at 0 is c0: the planner keeps it so
        that stealing stays affine in the stolen tokens (conservative for fully stolen
        requests, which in fact skip the prefill worker).
        """
        return (self.c2 * length + self.c1) * length + self.c0


@dataclass(frozen=True, slots=True)
class SuffixPredictor:
    """T_sfx(x | p) = s2 x^2 + s1 x + s0 + sp p x for an extend pass of x suffix tokens on a
    decode worker after a prefix of p tokens (§IV-B3).

    The paper's T_sfx depends on the suffix alone (``sp`` = 0). Its tokens attend over the
    prefix too, p x query-key pairs of the L^2 / 2 a prefill of L = p + x tokens computes, so
    the extend grows with the context it continues: on the H200 profile's measurements a
    2,048-token suffix took 62.4 ms after a 512-token prefix and 69.3 ms after a 2,048-token
    one; the fit with the prefix term puts it at 0.16 s after 14,336 (the last 2,048 tokens of
    a 16K-token prompt), where the fit of the suffix alone put it at 0.07 s. A budget turned
    into tokens by the suffix alone admits suffixes of long prompts that take more than twice
    the TPOT slack it was given."""

    s1: float
    s0: float
    s2: float = 0.0
    sp: float = 0.0

    def __post_init__(self) -> None:
        if not (self.s1 > 0 and self.s0 >= 0 and self.s2 >= 0 and self.sp >= 0):
            raise ValueError("suffix predictor needs s1 > 0, s0 >= 0, s2 >= 0, sp >= 0")

    @overload
    def time(self, tokens: float, prefix: float = 0.0) -> float: ...
    @overload
    def time(self, tokens: FloatArray, prefix: float | FloatArray = 0.0) -> FloatArray: ...
    def time(
        self, tokens: float | FloatArray, prefix: float | FloatArray = 0.0
    ) -> float | FloatArray:
        """Predicted extend latency of a suffix of ``tokens`` tokens after ``prefix`` tokens
        of context (0 for no suffix). Works on scalars (the scheduler's per-iteration path)
        and on numpy arrays (a queue's or a pool's suffixes at once)."""
        if isinstance(tokens, np.ndarray):
            t = (self.s2 * tokens + self.s1 + self.sp * np.maximum(prefix, 0.0)) * tokens
            return np.where(tokens > 0, t + self.s0, 0.0)
        if tokens <= 0:
            return 0.0
        return (self.s2 * tokens + self.s1 + self.sp * max(float(prefix), 0.0)) * tokens + self.s0

    @overload
    def of_prompt(self, tokens: float, length: float) -> float: ...
    @overload
    def of_prompt(self, tokens: FloatArray, length: FloatArray) -> FloatArray: ...
    def of_prompt(
        self, tokens: float | FloatArray, length: float | FloatArray
    ) -> float | FloatArray:
        """T_sfx of the last ``tokens`` tokens of a ``length``-token prompt (its prefix the
        rest); scalars or arrays, as ``time``."""
        return self.time(tokens, length - tokens)  # type: ignore[arg-type]

    def max_tokens(self, budget_s: float, prefix: float = 0.0) -> int:
        """Inverse suffix predictor, eq. (16): the longest suffix whose time after ``prefix``
        tokens of context fits ``budget_s``.

        Returns the largest integer x with T_sfx(x | prefix) <= budget_s (0 if even one token
        does not fit). The closed form is only a starting point; the answer is checked against
        ``time`` itself so that float rounding can never make it one off either way.
        """
        if self.time(1, prefix) > budget_s:
            return 0
        rest = budget_s - self.s0
        b = self.s1 + self.sp * max(prefix, 0.0)
        if self.s2 == 0.0:
            x = rest / b
        else:
            # The rationalised root stays accurate when s2 is tiny.
            x = 2.0 * rest / (b + math.sqrt(b * b + 4.0 * self.s2 * rest))
        n = max(1, math.floor(x))
        while self.time(n + 1, prefix) <= budget_s:
            n += 1
        while n > 1 and self.time(n, prefix) > budget_s:
            n -= 1
        return n


@dataclass(frozen=True, slots=True)
class DecodeIterPredictor:
    """T_iter(N, C) = aC C + aN N + a0 (eq. 13)."""

    a_c: float
    a_n: float
    a_0: float

    def __post_init__(self) -> None:
        if not (self.a_c >= 0 and self.a_n >= 0 and self.a_0 > 0):
            raise ValueError("decode predictor needs aC >= 0, aN >= 0, a0 > 0")

    def time(self, batch: int, context_tokens: int) -> float:
        """Predicted latency of one decode iteration, eq. (13)."""
        return self.a_c * context_tokens + self.a_n * batch + self.a_0

    def added(self, context_tokens: float) -> float:
        """Seconds one more stream of ``context_tokens`` adds to an iteration, eq. (13)."""
        return self.a_c * context_tokens + self.a_n

    def iteration_times(self, batch: int, context_tokens: int, iterations: int) -> FloatArray:
        """Eq. (13) for each of ``iterations`` consecutive iterations of an unchanged batch,
        whose context grows by one token per member per iteration."""
        ctx = context_tokens + batch * np.arange(iterations, dtype=np.float64)
        return self.a_c * ctx + (self.a_n * batch + self.a_0)

    def span_time(self, batch: int, context_tokens: int, iterations: int) -> float:
        """The sum of :meth:`iteration_times` in closed form (an arithmetic series)."""
        k = iterations
        return k * self.time(batch, context_tokens) + self.a_c * batch * k * (k - 1) / 2

    def max_batch(self, tpot_slo: float, mean_context: float) -> int:
        """N_TPOT: the largest batch whose iteration meets ``tpot_slo`` (used by eq. 7).

        Solves aC (N * mean_context) + aN N + a0 <= tpot_slo for N.
        """
        per_request = self.a_c * mean_context + self.a_n
        room = tpot_slo - self.a_0
        if room <= 0:
            return 0
        if per_request <= 0:
            return 1 << 30
        return max(0, math.floor(room / per_request + 1e-9))


@dataclass(slots=True)
class RecursiveLeastSquares:
    """Exponentially-weighted recursive least squares for y ~ theta . x.

    A forgetting factor below 1 lets the fit follow drift (thermal throttling, a different
    kernel path after an upgrade) while old samples fade. Serving traffic excites the features
    poorly (a decode batch's context grows with its size, so C and N are nearly collinear); with
    forgetting, the covariance of the unexcited directions would grow without bound and the
    fit would wander there ("wind-up"). Capping the covariance's trace at its start value
    prevents that.
    """

    theta: FloatArray
    forgetting: float = 0.995
    p: FloatArray = field(init=False)
    samples: int = 0
    _trace_cap: float = field(init=False)

    def __post_init__(self) -> None:
        # A moderate prior keeps the start close to the offline profile.
        self.p = np.eye(len(self.theta)) * 1e2
        self._trace_cap = float(np.trace(self.p))

    def update(self, x: FloatArray, y: float) -> None:
        px = self.p @ x
        gain = px / (self.forgetting + float(x @ px))
        self.theta = self.theta + gain * (y - float(x @ self.theta))
        self.p = (self.p - np.outer(gain, px)) / self.forgetting
        trace = float(np.trace(self.p))
        if trace > self._trace_cap:
            self.p *= self._trace_cap / trace
        self.samples += 1


@dataclass(slots=True)
class _Refit:
    """Online recalibration of one predictor's coefficient vector (scaled units).

    Two candidates are fitted side by side: a full refit of every coefficient, and the offline
    coefficients times one scale factor (what uniform drift, e.g. a throttled clock, does).
    Serving traffic often excites the features poorly (a decode batch's context grows with its
    size, so C and N are nearly collinear), and a full fit can then predict well only along
    the observed direction; each candidate's error is therefore scored on every new sample
    before it is learned (prequential), and the one that predicts better is used.
    """

    offline: FloatArray
    forgetting: float
    full: RecursiveLeastSquares = field(init=False)
    scale: RecursiveLeastSquares = field(init=False)
    err_full: float = 0.0
    err_scale: float = 0.0
    samples: int = 0

    def __post_init__(self) -> None:
        self.full = RecursiveLeastSquares(self.offline.copy(), self.forgetting)
        self.scale = RecursiveLeastSquares(np.array([1.0]), self.forgetting)

    def _full_coefficients(self) -> FloatArray:
        return np.maximum(self.full.theta, 0.0)

    def observe(self, x: FloatArray, y: float) -> None:
        base = float(self.offline @ x)
        if y > 0:
            decay = 1.0 - self.forgetting
            e_full = abs(float(self._full_coefficients() @ x) - y) / y
            e_scale = abs(float(self.scale.theta[0]) * base - y) / y
            self.err_full += decay * (e_full - self.err_full)
            self.err_scale += decay * (e_scale - self.err_scale)
        self.full.update(x, y)
        self.scale.update(np.array([base]), y)
        self.samples += 1

    def coefficients(self) -> FloatArray:
        if self.err_full <= self.err_scale:
            return self._full_coefficients()
        return self.offline * max(float(self.scale.theta[0]), 1e-3)


@dataclass(slots=True)
class OnlineCalibrator:
    """Refits the three predictors from observed step times (adaptive mode).

    Features are scaled to keep the fits well conditioned (tokens in thousands, seconds in
    milliseconds). Until ``min_samples`` observations of a kind arrive, the offline
    coefficients stay in force.
    """

    prefill: PrefillPredictor
    suffix: SuffixPredictor
    decode: DecodeIterPredictor
    min_samples: int = 20
    forgetting: float = 0.995
    _pre: _Refit = field(init=False)
    _sfx: _Refit = field(init=False)
    _dec: _Refit = field(init=False)

    def __post_init__(self) -> None:
        p, s, d = self.prefill, self.suffix, self.decode
        f = self.forgetting
        self._pre = _Refit(np.array([p.c2 * 1e9, p.c1 * 1e6, p.c0 * 1e3]), f)
        self._sfx = _Refit(np.array([s.s2 * 1e9, s.s1 * 1e6, s.s0 * 1e3, s.sp * 1e9]), f)
        self._dec = _Refit(np.array([d.a_c * 1e6, d.a_n * 1e3, d.a_0 * 1e3]), f)

    def observe_prefill(self, tokens: int, seconds: float) -> PrefillPredictor:
        k = tokens / 1e3
        self._pre.observe(np.array([k * k, k, 1.0]), seconds * 1e3)
        if self._pre.samples >= self.min_samples:
            c2, c1, c0 = self._pre.coefficients()
            self.prefill = replace(
                self.prefill, c2=c2 * 1e-9, c1=max(c1, 1e-6) * 1e-6, c0=c0 * 1e-3
            )
        return self.prefill

    def observe_suffix(self, tokens: int, seconds: float, prefix: int = 0) -> SuffixPredictor:
        """An extend of ``tokens`` suffix tokens after ``prefix`` tokens took ``seconds``."""
        k, q = tokens / 1e3, prefix / 1e3
        self._sfx.observe(np.array([k * k, k, 1.0, q * k]), seconds * 1e3)
        if self._sfx.samples >= self.min_samples:
            s2, s1, s0, sp = self._sfx.coefficients()
            self.suffix = replace(
                self.suffix, s2=s2 * 1e-9, s1=max(s1, 1e-6) * 1e-6, s0=s0 * 1e-3, sp=sp * 1e-9
            )
        return self.suffix

    def observe_decode(
        self, batch: int, context_tokens: int, seconds: float
    ) -> DecodeIterPredictor:
        self._dec.observe(np.array([context_tokens / 1e3, batch, 1.0]), seconds * 1e3)
        if self._dec.samples >= self.min_samples:
            a_c, a_n, a_0 = self._dec.coefficients()
            self.decode = replace(
                self.decode, a_c=a_c * 1e-6, a_n=a_n * 1e-3, a_0=max(a_0, 1e-3) * 1e-3
            )
        return self.decode


@dataclass(frozen=True, slots=True)
class TransferModel:
    """KV hand-off time = bytes / bandwidth + base latency."""

    bandwidth: float
    base_latency: float

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.base_latency >= 0):
            raise ValueError("transfer model needs bandwidth > 0 and base latency >= 0")

    def time(self, nbytes: int) -> float:
        return nbytes / self.bandwidth + self.base_latency
