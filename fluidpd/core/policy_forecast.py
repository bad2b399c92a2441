"""Predictive switch rule (issue #14, beyond the paper): what a role switch gains and costs.

The paper's thresholds (eqs. 22-23) say *that* a phase is pressured, not whether moving a
worker helps: on long prompts DPI_adm passes 0.2 with a handful of requests, and PPI can stay
high while decode admission is what holds prefill back. Here the controller forecasts, with
the profile's own predictors (eqs. 2 and 13) and the demand it has seen over the last minute,
each phase's load relative to what that phase can carry within the SLO, for the split it has,
the split a switch would give and the split during the drain, and switches only when the
forecast gain clearly beats the cost.

Every limit is relative to the deployment, the prompts and the SLO, none is a constant tuned
on a trace:

* prefill load ``u_P = rate * E[T_pre(L)] / n_P`` (busy fraction per prefill worker) is
  compared with the largest busy fraction whose M/D/1 queueing delay still fits the TTFT
  budget, ``2 (S_TTFT - T) / (2 S_TTFT - T)`` for a mean prefill time T (so long prompts and
  tight SLOs leave less headroom);
* decode load is the larger of the concurrency needed to stream ``rate * E[O] / n_D`` tokens
  per second at the iteration time of eq. (13), relative to N_TPOT at the mean context, and
  the KV it holds (requests in decode plus those whose prefill runs, each committing
  prompt + clipped output) relative to the pool's KV capacity.

The bottleneck ratio ``B = max(u_P / u_P*, u_D)`` is above 1 where the split cannot meet the
SLO. A switch gains ``horizon * (excess(B_now) - excess(B_after))`` overloaded seconds and costs
``drain * excess(B_during)`` (one worker is out of service while it drains), where
``excess(B) = max(0, B - 1)``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from fluidpd.core.predictors import DecodeIterPredictor, PrefillPredictor
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO, Role

#: Fewest arrivals a forecast rests on. Below it the rate's error bound (``RATE_Z`` standard
#: errors, below) passes 45 % and the bounded forecast is no forecast.
MIN_DEMAND_SAMPLES = 20
#: Standard errors of the Poisson rate estimate (1/sqrt(n) relative) the forecast allows for:
#: the gain is counted at the lower bound of the rate and the donor checked at the upper one,
#: so that a switch decided on few arrivals is taken only when it is clear whatever the
#: estimate's error, and one decided on many is not held back by a fixed sample count.
RATE_Z = 2.0


@dataclass(frozen=True, slots=True)
class Demand:
    """What the router saw arrive over the recent window."""

    #: Requests per second.
    rate: float
    #: Mean prompt tokens and mean output tokens (``max_new_tokens``) per request.
    prompt: float
    output: float
    #: Mean predicted prefill seconds per request, E[T_pre(L)] (eq. 2 per request).
    prefill_s: float
    #: Arrivals the estimate rests on, and whether a whole window has been seen.
    samples: int = 0
    full_window: bool = False
    #: The busiest recent rate the arrivals show beyond Poisson noise (requests per second;
    #: see ``DemandWindow``); 0 when unknown. The donor phase of a switch must carry it.
    peak_rate: float = 0.0

    @property
    def reliable(self) -> bool:
        """Enough arrivals for the rate's error bound to mean something."""
        return self.samples >= MIN_DEMAND_SAMPLES

    @property
    def rate_error(self) -> float:
        """Relative error bound of the rate: ``RATE_Z / sqrt(samples)`` (Poisson), at most 1."""
        if self.samples <= 0:
            return 1.0
        return min(1.0, RATE_Z / math.sqrt(self.samples))

    def at_rate(self, rate: float) -> Demand:
        return Demand(
            rate,
            self.prompt,
            self.output,
            self.prefill_s,
            self.samples,
            self.full_window,
            self.peak_rate,
        )

    @property
    def low(self) -> Demand:
        """This demand at the lower bound of its rate (where a switch's gain is counted)."""
        return self.at_rate(self.rate * (1.0 - self.rate_error))

    @property
    def burst(self) -> Demand:
        """This demand at the busiest rate it may bring soon: the upper bound of the rate, or
        the recent peak if that is higher (the donor of a switch must carry it)."""
        return self.at_rate(max(self.peak_rate, self.rate * (1.0 + self.rate_error)))


@dataclass(frozen=True, slots=True)
class Split:
    n_prefill: int
    n_decode: int

    def after(self, source: Role) -> Split:
        """The split once a ``source`` worker has switched to the other role."""
        if source is Role.DECODE:
            return Split(self.n_prefill + 1, self.n_decode - 1)
        return Split(self.n_prefill - 1, self.n_decode + 1)

    def during(self, source: Role) -> Split:
        """The split while the ``source`` worker drains (serving neither role's new work)."""
        if source is Role.DECODE:
            return Split(self.n_prefill, self.n_decode - 1)
        return Split(self.n_prefill - 1, self.n_decode)


@dataclass(frozen=True, slots=True)
class Forecast:
    """A switch's forecast; ``gain`` and ``cost`` are in overloaded seconds over the horizon."""

    before: float
    after: float
    during: float
    drain_s: float
    gain: float
    cost: float
    #: The donor phase's load ratio after the switch at the recent peak rate (``Demand.burst``):
    #: a switch that would overload the phase it takes the worker from only moves the
    #: bottleneck, and the next burst reverses it.
    donor_after: float = 0.0


def excess(ratio: float) -> float:
    """Fraction of demand a phase at this load ratio cannot serve within the SLO."""
    return max(0.0, ratio - 1.0)


def prefill_headroom(mean_prefill_s: float, ttft_slo: float) -> float:
    """u_P*: the busy fraction at which M/D/1 queueing plus service reaches the TTFT budget."""
    if mean_prefill_s >= ttft_slo:
        return 0.0
    return 2.0 * (ttft_slo - mean_prefill_s) / (2.0 * ttft_slo - mean_prefill_s)


@dataclass(frozen=True, slots=True)
class CapacityModel:
    """Per-phase load forecasts from one worker's profile (every worker is the same kind)."""

    prefill: PrefillPredictor
    decode: DecodeIterPredictor
    kv_capacity: int
    max_running: int
    reserve_output_clip: int
    slo: SLO
    #: Seconds a D->P drain takes when it migrates (KV moves), and the role-flip overheads.
    to_prefill_s: float
    to_decode_s: float

    @classmethod
    def from_profile(cls, profile: Profile, slo: SLO) -> CapacityModel:
        return cls(
            profile.prefill_predictor(),
            profile.decode_predictor(),
            profile.kv.capacity_tokens,
            profile.max_running_requests,
            profile.kv.reserve_output_clip,
            slo,
            profile.switch.to_prefill_ms * 1e-3,
            profile.switch.to_decode_ms * 1e-3,
        )

    def prefill_ratio(self, d: Demand, n_prefill: int) -> float:
        """u_P / u_P* for ``n_prefill`` workers (inf with none, or if one prompt alone misses
        the TTFT budget)."""
        if d.rate <= 0:
            return 0.0
        headroom = prefill_headroom(d.prefill_s, self.slo.ttft)
        if n_prefill <= 0 or headroom <= 0:
            return math.inf
        return d.rate * d.prefill_s / n_prefill / headroom

    def decode_ratio(self, d: Demand, n_decode: int) -> float:
        """max(concurrency / N_TPOT, committed KV / capacity) for ``n_decode`` workers."""
        if d.rate <= 0:
            return 0.0
        if n_decode <= 0:
            return math.inf
        tokens_per_s = d.rate * max(d.output, 1.0) / n_decode
        ctx = d.prompt + d.output / 2.0
        per_request = self.decode.a_c * ctx + self.decode.a_n
        if tokens_per_s * per_request >= 1.0:
            return math.inf  # no batch size streams this many tokens per second
        # Little's law: n concurrent streams at t(n) = per_request * n + a_0 seconds per
        # iteration deliver n / t(n) tokens per second.
        concurrency = tokens_per_s * self.decode.a_0 / (1.0 - tokens_per_s * per_request)
        n_tpot = min(self.max_running, self.decode.max_batch(self.slo.tpot, ctx))
        compute = concurrency / n_tpot if n_tpot > 0 else math.inf
        commit = d.prompt + min(d.output, self.reserve_output_clip)
        held = concurrency + d.rate / n_decode * d.prefill_s
        return max(compute, held * commit / self.kv_capacity)

    def bottleneck(
        self, d: Demand, split: Split, decode_scale: float = 1.0, prefill_scale: float = 1.0
    ) -> float:
        decode = decode_scale * self.decode_ratio(d, split.n_decode)
        return max(prefill_scale * self.prefill_ratio(d, split.n_prefill), decode)

    def drain_seconds(self, d: Demand, source: Role, migrate: bool) -> float:
        """Forecast drain + flip time: a prefill worker finishes about one prompt; a decode
        worker moves its KV (about a second) or, waiting, runs its longest stream out."""
        if source is Role.PREFILL:
            return d.prefill_s + self.to_decode_s
        if migrate:
            return 1.0 + self.to_prefill_s
        ctx = d.prompt + d.output / 2.0
        return 2.0 * d.output * self.decode.time(1, int(ctx)) + self.to_prefill_s

    def forecast(
        self,
        d: Demand,
        split: Split,
        source: Role,
        horizon_s: float,
        migrate: bool,
        observed_decode: float | None = None,
        observed_prefill: float | None = None,
    ) -> Forecast:
        """The switch's forecast. ``observed_decode`` (max of the decode pool's DPI-bar_load
        and DPI-bar_adm, the same ratio measured) and ``observed_prefill`` (PPI-bar: queued
        work over the time left to the deadlines, so also a load ratio against the SLO)
        rescale the forecasts of the current split, so that the model is only trusted for how
        the load changes with the pool size."""
        scale = decode_scale(self.decode_ratio(d, split.n_decode), observed_decode)
        p_scale = prefill_scale(self.prefill_ratio(d, split.n_prefill), observed_prefill)
        low = d.low
        before = self.bottleneck(low, split, scale, p_scale)
        after = self.bottleneck(low, split.after(source), scale, p_scale)
        during = self.bottleneck(low, split.during(source), scale, p_scale)
        drain = self.drain_seconds(d, source, migrate)
        gain = horizon_s * (excess(before) - excess(after))
        cost = drain * excess(during)
        peak, left = d.burst, split.after(source)
        if source is Role.DECODE:
            # A prefill pool still over capacity after the switch hands its excess to the
            # decode workers (FluidToken steals suffixes up to their TPOT budget, and queued
            # requests hold the decode KV reserved at dispatch), which eq. (13) does not see.
            # Until the decode pool's observation calibrates the model (it lags the demand),
            # such a donor must then hold whatever calibration the observation may bring.
            bound = scale
            if observed_decode is None and p_scale * self.prefill_ratio(peak, left.n_prefill) >= 1:
                bound = MAX_SCALE
            donor = bound * self.decode_ratio(peak, left.n_decode)
        else:
            donor = p_scale * self.prefill_ratio(peak, left.n_prefill)
        return Forecast(before, after, during, drain, gain, cost, donor)


#: Observed decode pressure at or above this is censored (DPI_adm cannot exceed 1; the excess
#: waits in the prealloc queue), so it can only raise the forecast, never lower it.
_CENSORED = 0.95


#: The calibration corrects the model by at most this factor either way.
MAX_SCALE = 4.0


def decode_scale(modelled: float, observed: float | None) -> float:
    """Observed / modelled decode ratio for the current split, within [1/4, 4]."""
    if observed is None or not math.isfinite(modelled) or modelled <= 0:
        return 1.0
    scale = observed / modelled
    if observed >= _CENSORED:
        scale = max(scale, 1.0)
    return min(MAX_SCALE, max(1.0 / MAX_SCALE, scale))


#: PPI-bar above this says little more (an expired deadline makes it huge): the prefill
#: calibration reads it up to here.
_PPI_CAP = 2.0


def prefill_scale(modelled: float, observed_ppi: float | None) -> float:
    """How far the prefill pool is past the model's load ratio: PPI-bar persistently above 1
    means the queue misses deadlines whatever the model says (it only raises the forecast;
    a quiet queue does not lower it, since the ratio must hold for bursts too)."""
    if observed_ppi is None or not math.isfinite(modelled) or modelled <= 0:
        return 1.0
    observed = min(observed_ppi, _PPI_CAP)
    if observed <= 1.0:
        return 1.0
    return min(MAX_SCALE, max(1.0, observed / modelled))


@dataclass(slots=True)
class DemandWindow:
    """Arrivals over the last ``window_s`` seconds, kept as running sums (the caller passes
    the times: the core has no clock)."""

    prefill: PrefillPredictor
    window_s: float = 60.0
    #: Peak-rate bins: arrivals are also counted per ``bin_s`` seconds over the last
    #: ``hold_s`` (the time a switched split is held before it may be reversed).
    bin_s: float = 30.0
    hold_s: float = 300.0
    _bins: deque[list[float]] = field(default_factory=deque)
    _items: deque[tuple[float, int, int, float]] = field(default_factory=deque)
    _first: float | None = None
    _prompt: float = 0.0
    _output: float = 0.0
    _prefill_s: float = 0.0

    def add(self, t: float, prompt: int, output: int) -> None:
        pre = float(self.prefill.time(float(prompt)))
        self._items.append((t, prompt, output, pre))
        self._prompt += prompt
        self._output += output
        self._prefill_s += pre
        if self._first is None:
            self._first = t
        index = float(math.floor(t / self.bin_s))
        if self._bins and self._bins[-1][0] == index:
            self._bins[-1][1] += 1
        else:
            self._bins.append([index, 1.0])

    def peak_rate(self, now: float) -> float:
        """The highest rate of a completed bin in the hold period, less one Poisson standard
        error (``(n - sqrt(n)) / bin_s``): a burst the arrivals show beyond noise, so that a
        steady Poisson stream's peak stays near its mean."""
        bins = self._bins
        current = math.floor(now / self.bin_s)
        while bins and (bins[0][0] + 1) * self.bin_s <= now - self.hold_s:
            bins.popleft()
        best = 0.0
        for index, n in bins:
            if index < current:
                best = max(best, (n - math.sqrt(n)) / self.bin_s)
        return best

    def demand(self, now: float) -> Demand:
        items = self._items
        while items and items[0][0] <= now - self.window_s:
            _, p, o, pre = items.popleft()
            self._prompt -= p
            self._output -= o
            self._prefill_s -= pre
        n = len(items)
        if n == 0 or self._first is None:
            return Demand(0.0, 0.0, 0.0, 0.0)
        # Before a full window has passed, the rate is over the time seen so far.
        seen = now - self._first
        span = max(min(self.window_s, seen), 1.0)
        return Demand(
            n / span,
            self._prompt / n,
            self._output / n,
            self._prefill_s / n,
            n,
            seen >= self.window_s,
            self.peak_rate(now),
        )


def clearly_worth(f: Forecast, margin: float) -> bool:
    """Switch only if the forecast gain beats the cost with a margin (gain >= (1 + margin) x
    cost), the bottleneck falls by at least ``margin`` of its value (a gain inside the
    forecast's own error is no reason to pay a drain), and the donor phase keeps within its
    SLO capacity at the recent peak rate (``donor_after < 1``). The last is what predicts
    across a reversal: a switch that overloads its donor gains only while the receiving
    phase is the worse one, and is reversed (within the reversal cooldown, paying a second
    drain) as soon as the load shifts back; the predictors compare the two phases' overloads
    too roughly to trade one for the other."""
    if math.isnan(f.gain) or math.isnan(f.cost) or math.isnan(f.donor_after):
        return False
    return (
        f.gain > 0
        and f.gain >= (1.0 + margin) * f.cost
        and f.after <= f.before * (1 - margin)
        and f.donor_after < 1.0
    )
