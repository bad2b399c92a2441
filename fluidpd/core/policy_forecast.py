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
  compared with the largest busy fraction whose queueing delay still fits the TTFT budget,
  ``2 (S_TTFT - T) / (2 (S_TTFT - T) + R)`` for a mean prefill time T and Kingman's
  ``R = T (c_a^2 / n_P + c_s^2)`` (``Demand.queue_residual``: one worker of n_P fed in turn),
  so long prompts, tight SLOs and spread-out prefill times leave less headroom;
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
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from fluidpd.core.predictors import DecodeIterPredictor, PrefillPredictor
from fluidpd.core.profile import Profile
from fluidpd.core.signals import kv_commitment
from fluidpd.core.types import SLO, Role

#: Fewest arrivals a forecast rests on. Below it the rate's error bound (``RATE_Z`` standard
#: errors, below) passes 45 % and the bounded forecast is no forecast.
MIN_DEMAND_SAMPLES = 20
#: Standard errors of the Poisson rate estimate (1/sqrt(n) relative) the forecast allows for:
#: the gain is counted at the lower bound of the rate and the donor checked at the upper one,
#: so that a switch decided on few arrivals is taken only when it is clear whatever the
#: estimate's error, and one decided on many is not held back by a fixed sample count.
RATE_Z = 2.0
#: Quantiles of the window's prefill times a demand keeps (``Demand.prefill_quantiles``).
PREFILL_QUANTILES = 16


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
    #: Mean square predicted prefill seconds, E[T_pre(L)^2]; 0 when unknown (then every
    #: prefill is taken to last the mean, the M/D/1 case).
    prefill_s2: float = 0.0
    #: Seconds of arrivals seen so far (at most the window); 0 when unknown.
    seen_s: float = 0.0
    #: Mean square output tokens, E[O^2]; 0 when unknown (then taken as E[O]^2).
    output2: float = 0.0
    #: Squared coefficient of variation of the gaps between arrivals; 0 when unknown (then
    #: taken as Poisson's 1).
    arrival_cv2: float = 0.0
    #: Predicted prefill seconds at evenly spaced quantiles of the window's requests
    #: (``PREFILL_QUANTILES`` of them); empty when unknown (then every prompt is taken to
    #: have the mean's TTFT budget).
    prefill_quantiles: tuple[float, ...] = ()
    #: The rate of the arrivals since the start of the current peak-rate bin, as its
    #: trailing thirds read it beyond Poisson noise (``DemandWindow.building_rate``); 0 when
    #: unknown. What a decode donor is checked at too (``rising``).
    building_rate: float = 0.0

    @property
    def reliable(self) -> bool:
        """Enough arrivals for the rate's error bound to mean something: as many as
        ``MIN_DEMAND_SAMPLES`` independent ones, where arrivals that come in clusters count
        as fewer (``samples / c_a^2``, the effective size of a renewal stream's sample: 61
        arrivals of a stream with c_a^2 = 9 read its rate as 6.1 req/s against 9.4)."""
        return self.samples >= MIN_DEMAND_SAMPLES * max(1.0, self.arrival_cv2)

    @property
    def prefill_work(self) -> float:
        """Prefill seconds asked for per second, ``rate E[T_pre]`` (one worker's busy
        fraction if it served them all)."""
        return self.rate * self.prefill_s

    @property
    def token_rate(self) -> float:
        """Output tokens asked for per second, ``rate E[O]`` (at least one token a request)."""
        return self.rate * max(self.output, 1.0)

    def attainable_prefill_s(self, ttft_s: float) -> float:
        """Mean predicted prefill seconds of the prompts whose prefill alone fits within
        ``ttft_s`` (from ``prefill_quantiles``; the mean of all when every quantile fits or
        they are unknown, at least ``ttft_s`` when none fits).

        A prompt whose prefill outlasts the TTFT target misses it at any split, so its budget
        cannot say how much queueing the pool has room for: what is left of the target after
        the prefill is what the prompts that can still make it may wait. Read over all
        prompts, a mix whose mean prefill passes the target (20K-token prompts, 2 s TTFT, an
        A100) gave a prefill pool busy 5-20 % of the time a load ratio of 3 to infinity, and
        no worker could leave it for the saturated decode pool."""
        times = self.prefill_quantiles
        if not times or max(times) < ttft_s:
            return self.prefill_s
        fit = [t for t in times if t < ttft_s]
        return sum(fit) / len(fit) if fit else max(self.prefill_s, ttft_s)

    @property
    def prefill_residual(self) -> float:
        """E[T^2] / E[T]: twice the mean residual prefill time an arrival waits behind (equal
        to the mean prefill time when every prefill lasts the same)."""
        if self.prefill_s <= 0:
            return 0.0
        return max(self.prefill_s2 / self.prefill_s, self.prefill_s)

    def queue_residual(self, n_prefill: int) -> float:
        """Kingman's ``E[T] (c_a^2 + c_s^2)`` for one of ``n_prefill`` workers that the
        router feeds in turn (round-robin, the default pairing): it stands in for
        ``prefill_residual`` (``E[T] (1 + c_s^2)``, the M/G/1 case) in the queueing wait.

        Dealing a stream out to n workers in turn sums n of its gaps into each worker's gap,
        so a worker's arrivals vary as ``c_a^2 / n`` of the stream's (``arrival_cv2``;
        Poisson's 1 when unknown). Modelled as n independent M/G/1 queues, 5P3D on 9K-token
        chats (Qwen3-14B, 3 s TTFT, 2.67 req/s) read as missing TTFT for 27 % of the prompts
        where it missed 4 % (Kingman: 6 %), and the forecast moved a sixth worker to prefill
        on it; the two decode workers left then saturated (-10.5 pp against static)."""
        if self.prefill_s <= 0:
            return 0.0
        ca2 = self.arrival_cv2 if self.arrival_cv2 > 0 else 1.0
        # prefill_residual - E[T] is E[T] c_s^2, the service's share.
        return self.prefill_s * ca2 / max(1, n_prefill) + self.prefill_residual - self.prefill_s

    @property
    def spread(self) -> float:
        """E[X^2] / E[X]^2 of the per-request work X of the phase whose work spreads most
        (prefill seconds, output tokens); 1 when every request asks for the same."""
        k = 1.0
        if self.prefill_s > 0 and self.prefill_s2 > 0:
            k = max(k, self.prefill_s2 / self.prefill_s**2)
        if self.output > 0 and self.output2 > 0:
            k = max(k, self.output2 / self.output**2)
        return k

    @property
    def rate_error(self) -> float:
        """Relative error bound of the work rate, at most 1: ``RATE_Z`` standard errors of a
        compound Poisson sum, ``sqrt(E[X^2] / E[X]^2 / samples)`` (``spread``), so that a few
        long prompts or outputs among the arrivals widen the bound as few arrivals do."""
        if self.samples <= 0:
            return 1.0
        return min(1.0, RATE_Z * math.sqrt(self.spread / self.samples))

    def at_rate(self, rate: float) -> Demand:
        return replace(self, rate=rate)

    @property
    def low(self) -> Demand:
        """This demand at the lower bound of its rate (where a switch's gain is counted)."""
        return self.at_rate(self.rate * (1.0 - self.rate_error))

    def beyond(self, margin: float) -> Demand:
        """This demand at the busiest rate a switch must carry without losing requests: the
        rate's upper bound raised by ``margin``, or the recent peak where that is higher.

        The bound is itself an estimate (``RATE_Z`` standard errors leave about one window
        in forty above it), the peak an observation. Near the decode KV knee a margin on the
        load ratio is none on the rate: eq. (13)'s streams grow without bound as the token
        rate nears what a worker delivers, so two decode workers of 8.8K-token chats
        (Llama-3.1-8B/A100) hold 36 of their 49 KV slots each at 4.86 req/s and are past
        them at 5.35."""
        return self.at_rate(
            max(self.peak_rate, self.rate * (1.0 + self.rate_error) * (1.0 + margin))
        )

    @property
    def burst(self) -> Demand:
        """This demand at the busiest rate it may bring soon: the upper bound of the rate, or
        the recent peak if that is higher (the donor of a switch must carry it)."""
        return self.beyond(0.0)

    @property
    def rising(self) -> Demand:
        """This demand with a burst that is building up in the current bin counted in its
        recent peak (``building_rate``): what a switch that takes a decode worker is checked
        at (``CapacityModel.forecast``).

        The completed bins miss a burst that began inside the current one. Arrivals rose
        from 2 to 25 req/s at 200 s of a trace of 2.4K-token prompts (Llama-3.1-8B/H200, 6
        workers, 1 s TTFT); at 221 s the completed bins read 6.2 req/s and the window 9.4, a
        D->P switch left two decode workers to carry the burst, and they missed nearly every
        request until the trace ended (static 3P3D 83.6 %, FluidPD 57.1 %; 91.8 % checked
        here, with no switch). A decode donor left past its KV stays full while the burst
        lasts, and the undo comes too late to help; a prefill donor's queue drains once the
        burst passes. Checked here too, the undo of a D->P switch whose one decode worker
        saturated in a burst (a P->D switch, its prefill donor past capacity at the burst's
        rate) waited 77 s longer (long chats on 8B/H100, 4 workers, 1 s TTFT: 64.2 -> 52.1 %,
        static 62.4 %).

        What it costs: the D->P switches taken seconds into bursts that the decode pool left
        absorbs only because they end soon (long chats on Llama-3.1-8B/A100, 8 workers at
        0.6x, seed 2 of the robustness matrix: 59.6 -> 32.8 %, the static split's figure);
        which kind a burst is, its first seconds cannot say."""
        return replace(self, peak_rate=max(self.peak_rate, self.building_rate))


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
    #: Forecast SLO loss (``CapacityModel.loss``: fraction of requests missing, plus the
    #: bottleneck's overload) now, after the switch and during its drain.
    loss_before: float = 0.0
    loss_after: float = 0.0
    loss_during: float = 0.0
    #: Arrivals over the horizon at the rate's lower bound: ``gain`` in requests is
    #: ``gain / horizon * arrivals``, and the split kept would miss ``loss_before * arrivals``.
    arrivals: float = 0.0
    #: The bottleneck ratio after the switch at the window's rate itself, and at the recent
    #: peak rate now and after the switch (the latter with the donor as ``donor_after``
    #: checks it).
    at_rate_after: float = 0.0
    burst_before: float = 0.0
    burst_after: float = 0.0
    #: Whether the donor phase's forecast rests on its own observation (a decode pool that
    #: has filled since the last switch; prefill workers that report their busy fraction).
    donor_observed: bool = False
    #: Forecast SLO loss (``CapacityModel.loss``) at the recent peak rate (``Demand.burst``)
    #: now and after the switch: a switch must not lose there what it gains at the lower bound.
    peak_loss_before: float = 0.0
    peak_loss_after: float = 0.0
    #: A prefill donor's load ratio at the recent peak rate before the switch, and its busy
    #: fraction there after it (0 and inf for a decode donor; see ``donor_keeps_up``).
    donor_before: float = 0.0
    donor_busy_after: float = math.inf
    #: Arrivals over the horizon at the recent peak rate (what ``peak_loss_*`` are shares of).
    peak_arrivals: float = 0.0
    #: The share of requests a decode donor itself misses at the recent peak rate after the
    #: switch, less the share it misses there before (``CapacityModel.decode_miss``; 0 for a
    #: prefill donor): what a switch that cannot be undone must keep small
    #: (``clearly_worth``'s ``final``, asked of decode donors only).
    donor_tail: float = 0.0
    #: Whether the receiving phase's forecast rests on its own observation (a decode pool
    #: settled since the last switch; prefill workers that report their busy fraction).
    receiver_observed: bool = False
    #: Seconds the gain is counted over (``gain / (loss_before - loss_after)``), and the SLO
    #: losses at the window's rate itself (``Demand.rate``) with the arrivals over the
    #: horizon there (``mean_arrivals`` 0: not forecast); see ``at_mean``.
    horizon_s: float = 0.0
    mean_loss_before: float = 0.0
    mean_loss_after: float = 0.0
    mean_loss_during: float = 0.0
    mean_arrivals: float = 0.0
    #: The donor phase's load ratio after the switch at the window's rate itself (inf: not
    #: forecast); see ``overload_traded``.
    donor_at_rate: float = math.inf
    #: Forecast SLO loss (``CapacityModel.loss``) before and after the switch at the rate a
    #: switch must carry (``Demand.beyond``), and the arrivals over the
    #: horizon there; see ``loses_beyond``.
    beyond_loss_before: float = 0.0
    beyond_loss_after: float = 0.0
    beyond_arrivals: float = 0.0
    #: The squared coefficient of variation of the gaps between the window's arrivals
    #: (``Demand.arrival_cv2``; Poisson's 1 where unknown); see ``overload_shared``.
    arrival_cv2: float = 1.0

    @property
    def saved(self) -> float:
        """Requests the switch saves over the horizon, net of its drain (forecast)."""
        horizon = self.gain / (self.loss_before - self.loss_after) if self.gain > 0 else 0.0
        if horizon <= 0:
            return 0.0
        return (self.gain - self.cost) / horizon * self.arrivals

    @property
    def noise(self) -> float:
        """The standard deviation of the misses the kept split would see over the horizon,
        ``sqrt(c_a^2 loss_before arrivals)``: a saving inside it is no evidence. Poisson's
        where arrivals are no burstier; clustered arrivals (``arrival_cv2`` past 1) miss in
        clusters, and the count's variance grows with them (the index of dispersion of a
        renewal stream's counts is its gaps' c_a^2, as ``Demand.reliable`` counts samples)."""
        return math.sqrt(max(0.0, self.loss_before) * self.arrivals * max(1.0, self.arrival_cv2))

    @property
    def prefill_donor(self) -> bool:
        """Whether the switch takes a prefill worker (its donor's busy fraction after it is
        forecast; a decode donor's is not)."""
        return math.isfinite(self.donor_busy_after)

    @property
    def loses_at_peak(self) -> bool:
        """Whether the switch loses requests at the recent peak rate beyond the Poisson noise
        of the misses there (``sqrt(peak_loss_before * peak_arrivals)``).

        A strict comparison refused switches whose loss there was a request or two (a
        second D->P switch of long chats on 8B/H200, 8 workers: 0.0343 against 0.0353 of
        1,496 arrivals at the peak, 1.5 requests against a standard deviation of 7.2; taken,
        92.8 against 92.1 %). Without the peak's arrivals (0) any loss there counts."""
        return loses(self.peak_loss_before, self.peak_loss_after, self.peak_arrivals)

    @property
    def loses_at_low(self) -> bool:
        """Whether the switch loses requests at the rate's lower bound beyond the Poisson
        noise of the misses there (``loses``)."""
        return loses(self.loss_before, self.loss_after, self.arrivals)

    @property
    def loses_beyond(self) -> bool:
        """Whether the switch loses requests beyond the noise of the misses at the rate past
        the bound (``Demand.beyond``) where the split kept still serves that rate (its
        forecast loss there below 1; past capacity, the share it cannot serve adds to its
        misses): a switch that turns a split which carries it into one that does not."""
        return self.beyond_loss_before < 1.0 and loses(
            self.beyond_loss_before, self.beyond_loss_after, self.beyond_arrivals
        )

    @property
    def at_mean(self) -> Forecast | None:
        """This forecast with its gain, cost and losses taken at the window's rate instead of
        the rate's lower bound (None where that was not forecast)."""
        if self.mean_arrivals <= 0 or self.horizon_s <= 0:
            return None
        gain, cost = gain_and_cost(
            self.horizon_s,
            self.drain_s,
            self.mean_loss_before,
            self.mean_loss_after,
            self.mean_loss_during,
        )
        return replace(
            self,
            gain=gain,
            cost=cost,
            loss_before=self.mean_loss_before,
            loss_after=self.mean_loss_after,
            loss_during=self.mean_loss_during,
            arrivals=self.mean_arrivals,
        )

    @property
    def net(self) -> float:
        """Gain less cost, at the rate's lower bound or, where larger, at the window's rate
        (how ``clearly_worth``'s two ways to win are ranked against each other)."""
        mean = self.at_mean
        return max(self.gain - self.cost, -math.inf if mean is None else mean.gain - mean.cost)


def gain_and_cost(
    horizon_s: float, drain_s: float, before: float, after: float, during: float
) -> tuple[float, float]:
    """A switch's gain and cost in overloaded seconds, from the SLO losses of the split kept
    (``before``), the split after it and the split during its drain: against keeping the
    split, the horizon at the new split's loss instead of the old one's, except the drain,
    which runs at the during-split's loss."""
    return horizon_s * (before - after), drain_s * max(0.0, during - after)


def loses(before: float, after: float, arrivals: float) -> bool:
    """Whether a split's forecast loss ``after`` passes ``before`` by more than the Poisson
    standard deviation of the misses, ``sqrt(before * arrivals)``, over ``arrivals``
    requests (any loss counts without arrivals)."""
    lost = after - before
    if lost <= 0:
        return False
    if arrivals <= 0:
        return True
    return lost * arrivals > math.sqrt(max(0.0, before) * arrivals)


def excess(ratio: float) -> float:
    """Fraction of demand a phase at this load ratio cannot serve within the SLO."""
    return max(0.0, ratio - 1.0)


def unserved(ratio: float) -> float:
    """Share of demand a phase at this load ratio cannot serve within the SLO, ``1 - 1/B``
    past capacity (1 for a phase that cannot serve at all), 0 within it."""
    if ratio <= 1.0:
        return 0.0
    return 1.0 - 1.0 / ratio


def prefill_headroom(
    mean_prefill_s: float, ttft_slo: float, residual_s: float | None = None
) -> float:
    """u_P*: the busy fraction at which queueing plus service reaches the TTFT budget.

    With B = S_TTFT - T the time a prompt of mean prefill time T may wait, and R the
    residual (``residual_s``: E[T^2]/E[T] for M/G/1, ``Demand.queue_residual`` for a worker
    of a round-robin pool; T itself when not given), the mean wait ``rho R / (2 (1 - rho))``
    (Pollaczek-Khinchine, Kingman) equals B at ``rho = 2B / (2B + R)``: prompts whose prefill
    times spread widely (4-16K tokens) leave less headroom than their mean says."""
    if mean_prefill_s >= ttft_slo:
        return 0.0
    budget = ttft_slo - mean_prefill_s
    residual = mean_prefill_s if residual_s is None else max(residual_s, 0.0)
    return 2.0 * budget / (2.0 * budget + residual)


def prefill_miss(busy: float, budget_s: float, residual_s: float) -> float:
    """Fraction of prompts whose queueing wait passes ``budget_s`` at per-worker busy fraction
    ``busy``: the M/G/1 wait tail ``P(W > t) ~ rho exp(-t rho / E[W])`` (exact for M/M/1, the
    usual exponential approximation otherwise) with the Pollaczek-Khinchine mean wait, so
    ``rho exp(-2 (1 - rho) t / R)``. It grows smoothly with the load well before the queue is
    unstable (at the headroom u_P* about a third of the prompts miss), which is what a
    split that is within capacity but misses deadlines needs to be judged by."""
    return prefill_misses(busy, (budget_s,), residual_s)[0]


def prefill_misses(busy: float, budgets_s: Iterable[float], residual_s: float) -> list[float]:
    """``prefill_miss`` for each of ``budgets_s`` (a demand's prefill-time quantiles' budgets
    in one call: the control step asks for thousands a minute)."""
    budgets = list(budgets_s)
    if busy <= 0:
        return [0.0] * len(budgets)
    if busy >= 1.0:
        return [1.0] * len(budgets)
    if residual_s <= 0:
        return [1.0 if b <= 0 else 0.0 for b in budgets]
    rate = -2.0 * (1.0 - busy)
    return [1.0 if b <= 0 else min(1.0, busy * math.exp(rate * b / residual_s)) for b in budgets]


def poisson_tail(mean: float, limit: float) -> float:
    """P(N > limit) for N ~ Poisson(mean) (normal approximation with continuity correction):
    the number of requests in an M/G/infinity stage is Poisson, so this is the fraction of
    time the decode pool's concurrent streams (or their KV) pass what a worker holds."""
    if mean <= 0:
        return 0.0
    if not math.isfinite(mean) or limit <= 0:
        return 1.0
    return 0.5 * math.erfc((limit + 0.5 - mean) / math.sqrt(2.0 * mean))


def combined_miss(*misses: float) -> float:
    """A request misses if any stage it passes misses (stages taken as independent)."""
    kept = 1.0
    for m in misses:
        kept *= 1.0 - min(1.0, max(0.0, m))
    return 1.0 - kept


@dataclass(frozen=True, slots=True)
class DecodeLoad:
    """One decode worker's share of a demand, in the terms of eq. (13): ``tokens_per_s`` to
    stream, an iteration of ``n`` streams taking ``t(n) = per_request n + a_0`` seconds,
    at most ``n_tpot`` streams within the TPOT target and ``slots`` requests' KV, of which
    ``reserved`` are held by requests not yet decoding (queued and prefilling)."""

    tokens_per_s: float
    per_request: float
    a_0: float
    n_tpot: float
    slots: float
    reserved: float

    @property
    def concurrency(self) -> float:
        """Streams decoding at once (Little's law: ``n`` streams deliver ``n / t(n)`` tokens
        per second); inf when no batch size streams the tokens asked for."""
        if self.tokens_per_s * self.per_request >= 1.0:
            return math.inf
        return self.tokens_per_s * self.a_0 / (1.0 - self.tokens_per_s * self.per_request)

    @property
    def held(self) -> float:
        """Requests holding KV: the streams and the reservations."""
        return self.concurrency + self.reserved

    @property
    def demand_ratio(self) -> float:
        """max(concurrency / N_TPOT, held / slots): the streams and KV asked for against what
        the worker holds (inf past the rate at which the streams grow without bound)."""
        if self.n_tpot <= 0:
            return math.inf
        return max(self.concurrency / self.n_tpot, self.held / self.slots)

    @property
    def throughput_ratio(self) -> float:
        """Tokens per second asked over the most the worker delivers within the SLO,
        ``m / t(m)`` for the largest batch ``m`` that both N_TPOT and the KV the
        reservations leave allow; inf where they leave no batch.

        ``n / t(n)`` grows with ``n``, so the concurrency is at most ``m`` exactly where
        this ratio is at most 1: it passes 1 at the same rate as the concurrency and KV
        terms of ``CapacityModel.decode_ratio``. Past it those grow without bound as the
        rate nears ``1 / per_request`` tokens per second and are infinite beyond, where
        every split short of that rate reads the same: a decode pool past capacity at 4P4D
        and at 3P5D alike gave P->D no gain, though 2P6D carried the load (azure-staged,
        Qwen3-30B-A3B/A100, 8 workers at 1.2 x r_best: static 29.5 %, FluidPD 29.0 %).
        This ratio is finite, falls with each decode worker added, and ``unserved`` of it
        is the share of the tokens the worker cannot serve."""
        batch = min(self.n_tpot, self.slots - self.reserved)
        if batch <= 0:
            return math.inf
        return self.tokens_per_s * (self.per_request + self.a_0 / batch)


def _without_decode_load(d: Demand, n_decode: int) -> tuple[float, float] | None:
    """(decode miss, decode ratio) where there is no decode load to model: (0, 0) with no
    demand, (1, inf) with no decode worker; None otherwise."""
    if d.rate <= 0:
        return 0.0, 0.0
    if n_decode <= 0:
        return 1.0, math.inf
    return None


def _occupancy_miss(load: DecodeLoad, scale: float) -> float:
    """``CapacityModel.decode_miss`` of a decode worker's share ``load``."""
    return max(
        poisson_tail(scale * load.concurrency, load.n_tpot),
        poisson_tail(scale * load.held, load.slots),
    )


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
    #: Whether the prefill queueing wait counts the round-robin split of the arrivals across
    #: the prefill workers (``Demand.queue_residual``) or takes each worker's arrivals as the
    #: whole stream's (M/G/1, ``Demand.prefill_residual``).
    split_arrivals: bool = True

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

    def _residual(self, d: Demand, n_prefill: int) -> float:
        return d.queue_residual(n_prefill) if self.split_arrivals else d.prefill_residual

    def prefill_busy(self, d: Demand, n_prefill: int) -> float:
        """Busy fraction per prefill worker, ``rate E[T_pre] / n_P`` (inf with none)."""
        if d.rate <= 0:
            return 0.0
        if n_prefill <= 0:
            return math.inf
        return d.prefill_work / n_prefill

    def prefill_ratio(self, d: Demand, n_prefill: int) -> float:
        """u_P / u_P* for ``n_prefill`` workers (inf with none, or if one prompt alone misses
        the TTFT budget)."""
        if d.rate <= 0:
            return 0.0
        if n_prefill <= 0:
            return math.inf
        headroom = prefill_headroom(
            d.attainable_prefill_s(self.slo.ttft), self.slo.ttft, self._residual(d, n_prefill)
        )
        if headroom <= 0:
            return math.inf
        return self.prefill_busy(d, n_prefill) / headroom

    def queue_budget(self, d: Demand) -> float:
        """The longest a prompt may queue for prefill and still meet TTFT: the target less
        the mean prefill time of the prompts that can meet it."""
        return max(0.0, self.slo.ttft - d.attainable_prefill_s(self.slo.ttft))

    def prefill_wait(self, d: Demand, n_prefill: int, scale: float = 1.0) -> float:
        """Mean seconds a prompt waits in the prefill queue (Kingman's mean wait for one of
        ``n_prefill`` workers, at the busy fraction times the calibration ``scale``), at most
        its TTFT budget: past it the prompt
        is lost to the SLO whatever it waits, which ``prefill_miss`` counts."""
        budget = self.queue_budget(d)
        busy = scale * self.prefill_busy(d, n_prefill)
        if busy <= 0:
            return 0.0
        if busy >= 1.0:
            return budget
        residual = self._residual(d, n_prefill)
        return min(budget, busy * residual / (2.0 * (1.0 - busy)))

    def decode_load(self, d: Demand, n_decode: int, queued_s: float = 0.0) -> DecodeLoad:
        """One decode worker's share of the demand (``DecodeLoad``).

        KV is reserved when a request is dispatched, before its prefill starts (as SGLang
        does), so a request holds it while it waits in the prefill queue (``queued_s``, see
        ``prefill_wait``), while its prefill runs and while it decodes."""
        ctx = d.prompt + d.output / 2.0
        commit = kv_commitment(d.prompt, d.output, self.reserve_output_clip)
        return DecodeLoad(
            tokens_per_s=d.token_rate / n_decode,
            per_request=self.decode.a_c * ctx + self.decode.a_n,
            a_0=self.decode.a_0,
            n_tpot=float(min(self.max_running, self.decode.max_batch(self.slo.tpot, ctx))),
            slots=self.kv_capacity / commit if commit > 0 else math.inf,
            reserved=d.rate / n_decode * (queued_s + d.prefill_s),
        )

    def reserved_kv(self, d: Demand, n_decode: int) -> float:
        """The share of one decode worker's KV that requests hold, reserved at dispatch, while
        they queue for prefill (at most the TTFT budget's wait) and while their prefill runs."""
        if n_decode <= 0:
            return math.inf
        return self.waiting_kv(d, self.decode_load(d, n_decode, self.queue_budget(d)).reserved)

    def waiting_kv(self, d: Demand, waiting: float) -> float:
        """The KV ``waiting`` requests would commit (prompt + clipped output each, at the
        demand's means), as a fraction of one worker's capacity."""
        commit = kv_commitment(d.prompt, d.output, self.reserve_output_clip)
        return waiting * commit / self.kv_capacity if self.kv_capacity > 0 else math.inf

    def waiting_pressure(self, d: Demand, waiting: float, n_decode: int) -> float:
        """What ``waiting`` requests queued for one decode worker's KV add to its pressure:
        their KV (``waiting_kv``) times the share of the TTFT slack (the target less the mean
        prefill) that their mean wait takes, W = waiting / the worker's share of the rate by
        Little's law, at most all of it.

        A queue that clears well inside the slack costs no deadlines. Counted whole, two
        requests that waited 0.2 s of a 0.9 s slack read a lone decode worker at 1.13 where
        DPI_adm was 0.96, and the P->D switch on that reading left two prefill workers to a
        burst of longer prompts (1B/H200 short outputs, stress draw 20, cell 15: -14.8 pp
        against static). A queue that outlasts the slack counts in full: the lone decode
        worker left by a D->P switch at 1.00 of its KV with 23 requests waiting is past it
        by all of their KV."""
        per_worker = d.rate / max(1, n_decode)
        slack = self.slo.ttft - d.prefill_s
        share = 1.0
        if per_worker > 0 and slack > 0:
            share = min(1.0, waiting / per_worker / slack)
        return share * self.waiting_kv(d, waiting)

    def decode_ratio(self, d: Demand, n_decode: int, queued_s: float = 0.0) -> float:
        """max(concurrency / N_TPOT, committed KV / capacity) for ``n_decode`` workers within
        capacity; past it, the tokens asked for over the tokens the pool delivers
        (``DecodeLoad.throughput_ratio``)."""
        return self._pool_ratio(d, n_decode, queued_s, streams_only=False)

    def decode_stream_ratio(self, d: Demand, n_decode: int) -> float:
        """What a decode worker's own streams hold, as eq. (7)'s DPI_load measures it:
        max(active KV / capacity, concurrency / N_TPOT), the streams' context at the mean
        prompt plus half the mean output, with no KV reserved for requests not yet decoding;
        past capacity, the throughput ratio (``DecodeLoad.throughput_ratio``)."""
        return self._pool_ratio(d, n_decode, 0.0, streams_only=True)

    def _pool_ratio(self, d: Demand, n_decode: int, queued_s: float, streams_only: bool) -> float:
        """``decode_ratio`` (``streams_only`` False) or ``decode_stream_ratio``: the throughput
        ratio past capacity, and within it the streams and KV asked for or the streams' own."""
        if (edge := _without_decode_load(d, n_decode)) is not None:
            return edge[1]
        return self._load_ratio(d, self.decode_load(d, n_decode, queued_s), streams_only)

    def _load_ratio(self, d: Demand, load: DecodeLoad, streams_only: bool) -> float:
        """``_pool_ratio`` of the decode worker's share ``load`` of ``d``."""
        if streams_only:
            load = replace(load, reserved=0.0)
        past = load.throughput_ratio
        if 1.0 < past < math.inf:
            return past
        if not streams_only:
            # Within capacity, or requests not yet decoding hold all of the KV (their wait is
            # the prefill queue's): the streams and KV asked for.
            return load.demand_ratio
        if load.n_tpot <= 0:
            return math.inf
        ctx = d.prompt + d.output / 2.0
        kv = load.concurrency * ctx / self.kv_capacity if self.kv_capacity > 0 else math.inf
        return max(load.concurrency / load.n_tpot, kv)

    def decode_demand_ratio(self, d: Demand, n_decode: int, queued_s: float = 0.0) -> float:
        """max(concurrency / N_TPOT, committed KV / capacity) for ``n_decode`` workers at any
        load: what the demand asks a worker to hold against what it holds, infinite past
        the rate at which eq. (13)'s streams grow without bound. ``decode_ratio`` within
        capacity; past it, the measure a decode donor is checked by.

        Past capacity a KV-bound pool falls behind by its throughput ratio (``decode_ratio``)
        but its queue grows, and every request waits: the streams' share of the KV it would
        need says how far it is from keeping up, where the share of tokens it cannot serve
        says too little. Checked by its throughput ratio, 3P1D's one decode worker of long
        chats (8B/H200) read 1.14 at the peak against 2.6 here, a calibration of 0.84 took
        it under 1, and the switch left it saturated (61.4 % against 85.1 %)."""
        if (edge := _without_decode_load(d, n_decode)) is not None:
            return edge[1]
        return self.decode_load(d, n_decode, queued_s).demand_ratio

    def decode_miss(
        self, d: Demand, n_decode: int, scale: float = 1.0, queued_s: float = 0.0
    ) -> float:
        """Fraction of time a decode worker's streams pass N_TPOT or its committed KV passes
        capacity (``poisson_tail``), with the calibration ``scale`` on the load."""
        if (edge := _without_decode_load(d, n_decode)) is not None:
            return edge[0]
        return _occupancy_miss(self.decode_load(d, n_decode, queued_s), scale)

    def queue_miss(self, d: Demand, busy: float, n_prefill: int = 1) -> float:
        """Fraction of prompts that miss TTFT in the queue of one of ``n_prefill`` prefill
        workers at busy fraction ``busy``: ``prefill_miss`` with each prompt's own budget,
        S_TTFT less its prefill time, averaged over the demand's prefill-time quantiles (the
        mean's budget where they are unknown).

        The budgets of a mix of 4-16K-token prompts under a 1 s TTFT range from most of a
        second to none: a prompt whose prefill alone outlasts the target misses at any split,
        and with the mean's budget (0.3 s) for every prompt, those misses read as queueing
        the next prefill worker would save (long-long-bursty at 2.34 req/s, 8B/A100: a D->P
        switch taken at 31 s on a forecast saving of 4.8 requests, with the prefill workers
        busy 39 % of the time; the decode pool it left saturated in the burst, -23 pp)."""
        times = d.prefill_quantiles or (d.prefill_s,)
        budgets = (self.slo.ttft - t for t in times)
        return sum(prefill_misses(busy, budgets, self._residual(d, n_prefill))) / len(times)

    def loss(
        self, d: Demand, split: Split, decode_scale: float = 1.0, prefill_scale: float = 1.0
    ) -> float:
        """Forecast SLO loss of a split, between 0 and 2: the fraction of requests that miss
        (``prefill_miss`` of the prefill queue, ``decode_miss`` of the decode pool; 1 past
        capacity) plus the share of demand the bottleneck phase cannot serve,
        ``unserved(B)``, which keeps ordering splits that are all past capacity."""
        busy = prefill_scale * self.prefill_busy(d, split.n_prefill)
        queued = self.prefill_wait(d, split.n_prefill, prefill_scale)
        # ``decode_miss`` and ``decode_ratio`` of the same decode load, computed once.
        edge = _without_decode_load(d, split.n_decode)
        if edge is not None:
            decode_miss, decode_ratio = edge
        else:
            load = self.decode_load(d, split.n_decode, queued)
            decode_miss = _occupancy_miss(load, decode_scale)
            decode_ratio = self._load_ratio(d, load, streams_only=False)
        miss = combined_miss(self.queue_miss(d, busy, split.n_prefill), decode_miss)
        prefill_ratio = prefill_scale * self.prefill_ratio(d, split.n_prefill)
        # ``bottleneck``: the larger of ``phase_ratios``, prefill's first.
        bottleneck = max(prefill_ratio, decode_scale * decode_ratio)
        return miss + unserved(bottleneck)

    def bottleneck(
        self,
        d: Demand,
        split: Split,
        decode_scale: float = 1.0,
        prefill_scale: float = 1.0,
        reservations: bool = True,
    ) -> float:
        """max(prefill ratio, decode ratio); ``reservations=False`` leaves out the decode KV
        that requests hold while they wait in the prefill queue (the capacity definition the
        robustness suite's rates were first set by)."""
        return max(self.phase_ratios(d, split, decode_scale, prefill_scale, reservations).values())

    def phase_ratios(
        self,
        d: Demand,
        split: Split,
        decode_scale: float = 1.0,
        prefill_scale: float = 1.0,
        reservations: bool = True,
    ) -> dict[Role, float]:
        """Each phase's load ratio on ``split`` (``bottleneck`` is the larger): the prefill
        pool's, and the decode pool's with the KV held by the prompts its queue holds."""
        queued = self.prefill_wait(d, split.n_prefill, prefill_scale) if reservations else 0.0
        return {
            Role.PREFILL: prefill_scale * self.prefill_ratio(d, split.n_prefill),
            Role.DECODE: decode_scale * self.decode_ratio(d, split.n_decode, queued),
        }

    def fill_seconds(self, d: Demand, n_decode: int) -> float:
        """How long ``n_decode`` decode workers take to reach their steady load from empty: an
        M/G/infinity stage is at its stationary occupancy once its streams have run their
        course, so a prompt's prefill plus twice a mean stream (E[O] iterations at the
        iteration time of the forecast concurrency, eq. 13), or E[O^2] / E[O] iterations where
        that is longer. Before it, the decode pool's observed pressure understates its load and
        cannot calibrate the model.

        E[O^2] / E[O] is the mean length of the stream a token belongs to (twice the mean for
        exponential lengths): where outputs come in two kinds (70 % about 30 tokens, 30 %
        about 800), twice the mean (520 tokens) ends before the long streams do, the pool
        holds two thirds of its steady load, and that reading scaled the model down by 0.6; a
        D->P switch 6 s into the trace then left one decode worker that saturated a minute
        later (41.9 % against static 45.9 %)."""
        if d.rate <= 0 or n_decode <= 0:
            return math.inf
        load = self.decode_load(d, n_decode)
        if not math.isfinite(load.concurrency):
            return math.inf
        iteration = load.per_request * max(load.concurrency, 1.0)
        streams = 2.0 * d.output
        if d.output > 0 and d.output2 > 0:
            streams = max(streams, d.output2 / d.output)
        return d.prefill_s + streams * (iteration + self.decode.a_0)

    def drain_seconds(self, d: Demand, source: Role, migrate: bool) -> float:
        """Forecast drain + flip time: a prefill worker finishes about one prompt; a decode
        worker moves its KV (about a second) or, waiting, runs its longest stream out."""
        if source is Role.PREFILL:
            return d.prefill_s + self.to_decode_s
        if migrate:
            return 1.0 + self.to_prefill_s
        ctx = d.prompt + d.output / 2.0
        return 2.0 * d.output * self.decode.time(1, int(ctx)) + self.to_prefill_s

    def calibration(
        self,
        d: Demand,
        split: Split,
        source: Role,
        observed_decode: float | None = None,
        observed_prefill: float | None = None,
        observed_busy: float | None = None,
        filling_decode: float | None = None,
    ) -> tuple[float, float]:
        """The decode and prefill scales (``decode_scale``, ``prefill_scale``) that the
        observations put on the model of ``split`` (``forecast`` says how each is read)."""
        p_scale = prefill_scale(
            self.prefill_ratio(d, split.n_prefill),
            observed_prefill,
            observed_busy,
            self.prefill_busy(d, split.n_prefill),
        )
        queued = self.prefill_wait(d, split.n_prefill, p_scale)
        modelled = self.decode_ratio(d, split.n_decode, queued)
        if observed_decode is not None:
            scale = decode_scale(modelled, observed_decode)
        elif source is Role.DECODE:
            scale = max(1.0, decode_scale(modelled, filling_decode))
        else:
            scale = 1.0
        return scale, p_scale

    def may_save(
        self,
        d: Demand,
        split: Split,
        source: Role,
        horizon_s: float,
        observed_decode: float | None = None,
        observed_prefill: float | None = None,
        observed_busy: float | None = None,
        filling_decode: float | None = None,
    ) -> bool:
        """Whether ``forecast``'s switch (the same arguments) may save a request: at the rate's
        lower bound or at the window's rate, the split kept misses at least one request over
        the horizon and the split after the switch misses fewer. ``worth_basis`` takes no
        switch without this (``gain_clear``: a gain, and ``Forecast.saved`` at least 1, which
        is at most ``loss_before * arrivals``), so a caller that only looks for a switch
        worth taking may skip the forecast's other eight losses where it fails: the control
        step of a replay asks for two forecasts a second, and most save nothing."""
        scale, p_scale = self.calibration(
            d, split, source, observed_decode, observed_prefill, observed_busy, filling_decode
        )
        after = split.after(source)
        for at in (d.low, d):
            kept = self.loss(at, split, scale, p_scale)
            # The relative slack covers the rounding of ``Forecast.saved``'s own arithmetic.
            misses = kept * at.rate * horizon_s * (1.0 + 1e-9) >= 1.0
            if misses and self.loss(at, after, scale, p_scale) < kept:
                return True
        return False

    def forecast(
        self,
        d: Demand,
        split: Split,
        source: Role,
        horizon_s: float,
        migrate: bool,
        observed_decode: float | None = None,
        observed_prefill: float | None = None,
        observed_busy: float | None = None,
        filling_decode: float | None = None,
        margin: float = 0.0,
        observed_streams: float | None = None,
    ) -> Forecast:
        """The switch's forecast. ``observed_decode`` (max of the decode pool's DPI-bar_load
        and DPI-bar_adm, the same ratio measured) and ``observed_prefill`` (PPI-bar: queued
        work over the time left to the deadlines) with ``observed_busy`` (the prefill
        workers' measured busy fraction; see ``prefill_scale``) rescale the forecasts of the
        current split, so that the model is only trusted for how the load changes with the
        pool size.

        ``margin`` raises the rate's upper bound for the losses every switch is checked at
        (``Demand.beyond``, ``Forecast.loses_beyond``).

        ``observed_streams`` (DPI-bar_load alone, the streams' own KV and batch) checks a
        decode donor on its streams too: ``donor_after`` is at least the streams the pool
        left would hold at the peak (``decode_stream_ratio``), scaled by the streams
        observed over the model's. The calibration by the whole reading scales the KV that
        the prefill queue holds with the streams, and the model's queue moves with the
        switch. Behind one prefill worker busy 96 % of the time the model put the queue at
        its whole TTFT budget and its reservations past the three decode workers' KV, where
        DPI_adm read 0.69: the scale of 0.43 this gave was carried over to the two workers a
        D->P switch would leave, whose queue the second prefill worker would clear, and read
        them at 0.68 of capacity at the peak, while their streams alone were past it. They
        saturated at once (stress draw 24, cell 8: Llama-3.2-1B/H200, 4 workers, 3.4K-token
        prompts at 30.8 req/s: static 40.1 %, FluidPD 26.2 %; 40.4 % checked so, with no
        switch).

        ``filling_decode`` is the same decode reading taken before the pool has settled (it
        is still filling, since the first arrival or the last switch): a lower bound of its
        load. It may only raise the model, never lower it, and only where the decode pool is
        the donor, whose check it makes stricter; a P->D forecast keeps the model, since a
        reading the pool may not keep must not make a worker look needed there (taken for both,
        it reversed a D->P switch into a burst 26 s after it). Trusting the model alone there,
        a second D->P switch (Qwen3-14B, heavy-tailed prompts, 5P3D -> 6P2D, 29 s after the
        first) read the two decode workers left at 0.94 of capacity while the three observed
        ran at 1.5 times the model; 6P2D then missed nearly every request (11.1 % against
        static 36.8 %)."""
        scale, p_scale = self.calibration(
            d, split, source, observed_decode, observed_prefill, observed_busy, filling_decode
        )
        low = d.low
        before = self.bottleneck(low, split, scale, p_scale)
        after = self.bottleneck(low, split.after(source), scale, p_scale)
        during = self.bottleneck(low, split.during(source), scale, p_scale)
        drain = self.drain_seconds(d, source, migrate)
        loss_before = self.loss(low, split, scale, p_scale)
        loss_after = self.loss(low, split.after(source), scale, p_scale)
        loss_during = self.loss(low, split.during(source), scale, p_scale)
        gain, cost = gain_and_cost(horizon_s, drain, loss_before, loss_after, loss_during)
        # Whether each phase's forecast rests on its own observation: a settled decode reading,
        # the prefill workers' busy fraction.
        observed = {
            Role.DECODE: observed_decode is not None,
            Role.PREFILL: observed_busy is not None,
        }
        # A decode donor is checked at a burst as it builds too (``Demand.rising``).
        checked = d.rising if source is Role.DECODE else d
        peak, left = checked.burst, split.after(source)
        at_rate = self.phase_ratios(d, left, scale, p_scale)
        # ``donor_keeps_up``'s reading of a prefill donor; a decode donor has only its ratio.
        donor_before, donor_busy, donor_tail = 0.0, math.inf, 0.0
        if source is Role.DECODE:
            # A prefill pool still over capacity after the switch hands its excess to the
            # decode workers (FluidToken steals suffixes up to their TPOT budget, and queued
            # requests hold the decode KV reserved at dispatch), which eq. (13) does not see.
            # Until the decode pool's observation calibrates the model (it lags the demand),
            # such a donor must then hold whatever calibration the observation may bring.
            bound = scale
            if observed_decode is None and p_scale * self.prefill_ratio(peak, left.n_prefill) >= 1:
                bound = MAX_SCALE
            queued = self.prefill_wait(peak, left.n_prefill, p_scale)
            donor = bound * self.decode_demand_ratio(peak, left.n_decode, queued)
            if observed_streams is not None:
                modelled_streams = self.decode_stream_ratio(d, split.n_decode)
                stream_scale = decode_scale(modelled_streams, observed_streams)
                donor = max(donor, stream_scale * self.decode_stream_ratio(peak, left.n_decode))
            kept = self.prefill_wait(peak, split.n_prefill, p_scale)
            donor_tail = self.decode_miss(peak, left.n_decode, bound, queued) - self.decode_miss(
                peak, split.n_decode, scale, kept
            )
        else:
            donor = p_scale * self.prefill_ratio(peak, left.n_prefill)
            donor_before = p_scale * self.prefill_ratio(peak, split.n_prefill)
            donor_busy = p_scale * self.prefill_busy(peak, left.n_prefill)
        beyond = checked.beyond(margin)
        return Forecast(
            before,
            after,
            during,
            drain,
            gain,
            cost,
            donor,
            loss_before,
            loss_after,
            loss_during,
            low.rate * horizon_s,
            max(at_rate.values()),
            self.bottleneck(peak, split, scale, p_scale),
            max(donor, self.bottleneck(peak, left, scale, p_scale)),
            observed[source],
            self.loss(peak, split, scale, p_scale),
            self.loss(peak, left, scale, p_scale),
            donor_before=donor_before,
            donor_busy_after=donor_busy,
            peak_arrivals=peak.rate * horizon_s,
            donor_tail=donor_tail,
            horizon_s=horizon_s,
            receiver_observed=observed[source.other],
            mean_loss_before=self.loss(d, split, scale, p_scale),
            mean_loss_after=self.loss(d, left, scale, p_scale),
            mean_loss_during=self.loss(d, split.during(source), scale, p_scale),
            mean_arrivals=d.rate * horizon_s,
            donor_at_rate=at_rate[source],
            beyond_loss_before=self.loss(beyond, split, scale, p_scale),
            beyond_loss_after=self.loss(beyond, left, scale, p_scale),
            beyond_arrivals=beyond.rate * horizon_s,
            arrival_cv2=d.arrival_cv2 if d.arrival_cv2 > 0 else 1.0,
        )


#: Observed decode pressure at or above this is censored (DPI_adm cannot exceed 1; the excess
#: waits in the prealloc queue), so it can only raise the forecast, never lower it.
CENSORED = 0.95


#: The calibration corrects the model by at most this factor either way.
MAX_SCALE = 4.0


def decode_scale(modelled: float, observed: float | None) -> float:
    """Observed / modelled decode ratio for the current split, within [1/4, 4]."""
    if observed is None or not math.isfinite(modelled) or modelled <= 0:
        return 1.0
    scale = observed / modelled
    if observed >= CENSORED:
        scale = max(scale, 1.0)
    return min(MAX_SCALE, max(1.0 / MAX_SCALE, scale))


#: PPI-bar above this says little more (an expired deadline makes it huge): the prefill
#: calibration reads it up to here.
_PPI_CAP = 2.0


def prefill_scale(
    modelled: float,
    observed_ppi: float | None,
    observed_busy: float | None = None,
    modelled_busy: float | None = None,
) -> float:
    """How far the prefill pool is past the model's load: PPI-bar persistently above 1 means
    the queue misses deadlines whatever the model says (it only raises the forecast; a quiet
    queue does not lower it, since the ratio must hold for bursts too).

    By how much is read from what the pool does, not from the deadlines, where the workers
    report their measured busy fraction (``observed_busy``): the observed over the modelled
    busy fraction (``modelled_busy``, rate E[T_pre] / n_P) is the demand's and the engine's
    speed's error together, and a pool that is idle part of the time cannot be short of
    workers however late its requests are. PPI-bar grows without bound once deadlines pass
    (a slow host, a stall upstream of the pool: 1,862 live under host load 25-34, with a
    forecast prefill load of about 0.5), so read as a load ratio it takes any lateness for
    prefill overload. Without a busy report, PPI-bar (capped at ``_PPI_CAP``) stands in."""
    if observed_ppi is None or not math.isfinite(modelled) or modelled <= 0:
        return 1.0
    if observed_ppi <= 1.0:
        return 1.0
    if observed_busy is not None and modelled_busy is not None:
        if not math.isfinite(modelled_busy) or modelled_busy <= 0:
            return 1.0
        return min(MAX_SCALE, max(1.0, observed_busy / modelled_busy))
    observed = min(observed_ppi, _PPI_CAP)
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
    #: (arrival time, prompt, output, predicted prefill seconds, gap since the arrival
    #: before it; NaN for the first arrival)
    _items: deque[tuple[float, int, int, float, float]] = field(default_factory=deque)
    _first: float | None = None
    _latest: float | None = None
    _prompt: float = 0.0
    _output: float = 0.0
    _prefill_s: float = 0.0
    _prefill_s2: float = 0.0
    _output2: float = 0.0
    _gaps: float = 0.0
    _gaps2: float = 0.0
    _gapped: int = 0

    def add(self, t: float, prompt: int, output: int) -> None:
        pre = float(self.prefill.time(float(prompt)))
        gap = math.nan if self._latest is None else max(0.0, t - self._latest)
        self._latest = t
        self._items.append((t, prompt, output, pre, gap))
        self._prompt += prompt
        self._output += output
        self._prefill_s += pre
        self._prefill_s2 += pre * pre
        self._output2 += float(output) * output
        if not math.isnan(gap):
            self._gaps += gap
            self._gaps2 += gap * gap
            self._gapped += 1
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

    def building_rate(self, now: float) -> float:
        """The highest rate of the arrivals over the last third, two thirds and whole of a
        peak-rate bin, each less one Poisson standard error (``(n - sqrt(n)) / span``), over
        the spans that the arrivals seen so far cover: a burst as it builds, which the
        completed bins of ``peak_rate`` do not hold yet."""
        seen = now - (self._first if self._first is not None else now)
        spans = [self.bin_s * k / 3 for k in (1, 2, 3)]
        spans = [span for span in spans if span <= min(seen, self.window_s)]
        counts = [0] * len(spans)
        starts = [now - span for span in spans]
        # Newest first, stopping at the longest span: no copy of the window per interval.
        for item in reversed(self._items) if starts else ():
            t = item[0]
            if t <= starts[-1]:
                break
            for i, start in enumerate(starts):
                counts[i] += t > start
        return max(
            ((n - math.sqrt(n)) / span for n, span in zip(counts, spans, strict=True)),
            default=0.0,
        )

    def demand(self, now: float) -> Demand:
        items = self._items
        while items and items[0][0] <= now - self.window_s:
            _, p, o, pre, gap = items.popleft()
            self._prompt -= p
            self._output -= o
            self._prefill_s -= pre
            self._prefill_s2 -= pre * pre
            self._output2 -= float(o) * o
            if not math.isnan(gap):
                self._gaps -= gap
                self._gaps2 -= gap * gap
                self._gapped -= 1
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
            max(0.0, self._prefill_s2 / n),
            min(seen, self.window_s),
            max(0.0, self._output2 / n),
            self.arrival_cv2(),
            self.prefill_quantiles(),
            self.building_rate(now),
        )

    def prefill_quantiles(self) -> tuple[float, ...]:
        """The window's predicted prefill seconds at ``PREFILL_QUANTILES`` evenly spaced
        quantiles (midpoints of equal shares of the requests)."""
        times = sorted(item[3] for item in self._items)
        n = len(times)
        if n == 0:
            return ()
        k = PREFILL_QUANTILES
        return tuple(times[int((i + 0.5) * n / k)] for i in range(k))

    def arrival_cv2(self) -> float:
        """Squared coefficient of variation of the window's gaps between arrivals (about 1
        for a Poisson stream, more where arrivals cluster); 0 with fewer than two gaps."""
        k = self._gapped
        if k < 2 or self._gaps <= 0:
            return 0.0
        mean = self._gaps / k
        return max(0.0, self._gaps2 / k / (mean * mean) - 1.0)


class WorthBasis(StrEnum):
    """Why ``worth_basis`` takes a switch."""

    #: Its donor keeps up at the recent peak (``keeps_up_at_peak``).
    KEEPS_UP = "keeps-up"
    #: It trades an overload for one its receiver is observed in (``overload_traded``).
    TRADED = "traded"
    #: The split kept fails at the peak too (``overload_shared``).
    SHARED = "shared"


def clearly_worth(
    f: Forecast,
    margin: float,
    receiver_starved: bool = False,
    final: bool = False,
    share: bool = False,
) -> bool:
    """Whether ``worth_basis`` takes the switch on any basis."""
    return worth_basis(f, margin, receiver_starved, final, share) is not None


def worth_basis(
    f: Forecast,
    margin: float,
    receiver_starved: bool = False,
    final: bool = False,
    share: bool = False,
) -> WorthBasis | None:
    """Switch only if the forecast gain beats the cost with a margin (gain >= (1 + margin) x
    cost), the bottleneck falls by at least ``margin`` of its value (a gain inside the
    forecast's own error is no reason to pay a drain), and the donor phase keeps within its
    SLO capacity at the recent peak rate (``donor_after < 1``) and the switch loses nothing
    there beyond the noise of the misses (``Forecast.loses_at_peak``: the gain is counted at
    the rate's lower bound, where a donor left near its capacity costs nothing yet; 5P3D ->
    6P2D on 9K-token chats gained 2 % of the requests there and left the two decode
    workers at 0.96 of their KV at the peak, where the split lost more than it kept; when
    the rate then rose by a tenth, 6P2D missed most requests: 79.2 % static, 69.9 %
    FluidPD, 96.5 % with this check). The donor check is what predicts across a reversal: a
    switch that overloads its donor gains only while the receiving phase is the worse one,
    and is reversed (after the reversal cooldown, paying a second drain) as soon as the
    load shifts back; the predictors compare the two phases' overloads too roughly to trade
    one for the other on the model's word alone.

    Where the receiver's forecast rests on the model alone (``receiver_observed`` False: a
    decode pool not yet settled), the donor must keep up at the peak by the margin too
    (``donor_after < 1 / (1 + margin)``): a switch taken on the model's word should not also
    put its donor at the edge, where the peak's own error decides. In a pool of 16, one worker
    is an eighth of a phase, and the forecast found switches that left their donors just
    inside capacity: 8P8D -> 7P9D of long generations of long prompts (Llama-3.1-8B/H200,
    2 s TTFT) went 10 s into the trace with the seven prefill workers at 0.98 of the peak
    rate, which the next seconds' arrivals passed (static 97.4 %, FluidPD 87.1 %; 98.4 %
    with this check; `results/robustness/workers16/`). What it gives up: a switch whose
    donor at the edge would have held. The P->D switch 9 s into Azure-mixed on
    Qwen3-30B-A3B/A100 (4 workers, 3 s TTFT, 1.2x) left one prefill worker at 0.95 of the
    peak and served 99.3 % where 2P2D serves 77.4 %; refused, FluidPD serves 2P2D's figure.

    Two exceptions need the observation's word too. Where the phase that would get the
    worker is observed saturated and the donor is not (``receiver_starved``), an overload
    may be traded (``overload_traded``). Where the split kept fails at the peak as well, a
    prefill donor that fails only there is no reason to keep it (``overload_shared``), for a
    switch the caller lets share an overload (``share``: not an undo, nor a reversal inside
    the cooldown, which must keep their donors up) that is not ``final``.

    A ``final`` switch (the caller's: one no undo could follow inside the switch budget's
    window; ``FluidRolePolicy._final_away``) must also add at most ``margin`` of the
    requests to what the donor phase itself misses at the recent peak rate
    (``Forecast.donor_tail``). A decode donor under capacity on its mean load still misses
    whenever its streams or KV pass a worker's share, and there it collapses rather than
    degrades: requests wait for its KV while holding what they reserved. 5P3D -> 6P2D of
    9K-token chats (Qwen3-14B/A100, 3 s TTFT, the second switch in two minutes) left two
    decode workers at 0.84 of their KV at the peak; the rate rose a fifth, and they missed
    most requests for the last two minutes of the trace, the spent budget holding the undo
    back (static 79.0 %, FluidPD 70.4 %, 95.9 % with this check). A switch the budget can
    still undo is checked by its mean, as before: the same check on every switch refused
    the right ones of overloaded long-prompt deployments (34.4 -> 15.6 %).

    No switch may lose requests at the rate's bound raised by ``margin``
    (``Forecast.loses_beyond``) where the split kept still serves that rate. The margin on
    the rate is what stands for the forecast's error near the decode KV knee, where the
    load ratio rises steeply with it. 5P3D -> 6P2D of 8.8K-token chats (Llama-3.1-8B/A100,
    2 s TTFT, 4.17 req/s over the window, the second switch in 83 s) read the two decode
    workers left at 0.79 of capacity at the bound (4.86 req/s) and lost nothing there; for
    the next minute the trace ran at 4.8-5.25 req/s, and 6P2D missed TTFT for 41-65 % of
    the requests (static 72.9 %, FluidPD 83.4 %, 96.8 % with this check; 5P3D 95.9 %). An
    undo does not make the bet safe: a decode worker whose KV filled stays full for as long
    as requests keep arriving near its rate, and the undo comes only once the loss is seen.
    2P2D -> 3P1D of 8.5K-token chats (Llama-3.1-8B/A100, 3 s TTFT), taken 22 s into the
    trace on 37 arrivals (1.68 req/s, the bound 2.66), read the lone decode worker within
    capacity at the bound, where 3P1D lost 0.89 of the requests and 2P2D 0.72; the trace ran
    at 1.75-2.8 req/s, the worker's KV filled at 120 s and stayed full for 150 s, and the
    undo came at 191 s (static 89.4 %, FluidPD 88.1 %, 92.9 % with this check on every
    switch). Where the split kept fails at that rate too, the check does not apply: asked
    of the donor's added misses there instead, it refused the right second switch of
    overloaded long-prompt deployments (Qwen3-30B-A3B/A100, 8 workers, strict: 54.1 ->
    34.2 %).

    The lower bound of the rate hides a gain where the split kept misses nothing there.
    Long generations of long prompts (Qwen3-30B-A3B/A100, 2P2D, 0.76 req/s, 32-51 arrivals a
    window: the lower bound 32-41 % under the window's rate) read no loss at the lower bound
    for either split while the two decode workers ran at 0.75-0.99 of their KV with requests
    waiting for it, and the P->D switch came at 736 s (static 59.8 %, FluidPD
    87.6 %; 99.4 % switching at 64 s, 1P3D 99.8 %). So where the split kept misses less
    than a request over the horizon at the lower bound, the gain may be counted at the
    window's rate (``Forecast.at_mean``), for a switch that loses nothing beyond the noise
    at the lower bound, keeps its donor up at the peak, is not ``final``, and whose two
    phases' forecasts rest on their own observation (``receiver_observed``,
    ``donor_observed``). Without the first condition a D->P switch whose saving at the lower
    bound was inside the noise went (74.5 -> 69.4 %); without the receiver's observation, a
    P->D switch went 7 s into a trace on the decode model alone (56.5 -> 46.0 %); without the
    donor's, a second D->P switch went 5 s after the first, before the decode pool it left
    had settled, and the output mix shift that followed saturated its one decode worker
    (stress draw 4, cell 148: 94.9 -> 58.9 %); as the budget's last switch, a second D->P
    switch was right for the 50 s until outputs grew 2.6-fold and wrong for the rest, with
    no undo left (stress draw 4, cell 5: 89.7 -> 73.6 %)."""
    if math.isnan(f.gain) or math.isnan(f.cost) or math.isnan(f.donor_after):
        return None
    if (final and f.donor_tail > margin) or f.loses_beyond:
        return None
    keeps_up = keeps_up_at_peak(f, 0.0 if f.receiver_observed else margin)
    if gain_clear(f, margin):
        if keeps_up:
            return WorthBasis.KEEPS_UP
        if receiver_starved and overload_traded(f, margin):
            return WorthBasis.TRADED
        if share and not final and overload_shared(f, margin):
            return WorthBasis.SHARED
        return None
    # Where the split kept misses nothing at the rate's lower bound (less than a request
    # over the horizon), the lower bound cannot tell the splits apart, and the window's rate
    # decides, for a switch that loses nothing beyond the noise at the lower bound and keeps
    # its donor up at the peak.
    mean = f.at_mean
    blind = f.loss_before * f.arrivals < 1.0
    at_mean = (
        keeps_up
        and blind
        and not final
        and f.receiver_observed
        and f.donor_observed
        and mean is not None
        and gain_clear(mean, margin)
        and not f.loses_at_low
    )
    return WorthBasis.KEEPS_UP if at_mean else None


def gain_clear(f: Forecast, margin: float) -> bool:
    """The forecast gain beats the cost by the margin, the loss falls by the margin, and the
    requests saved pass the noise of the misses the kept split would see (``Forecast.noise``:
    Poisson's, widened by clustered arrivals). Counted as Poisson's under gamma arrivals of
    c_a^2 6.6, 1.2 requests saved of 236 over the horizon (2P2D -> 3P1D, the decode pool
    idle at 0.04) passed a noise of 1.1; half-way, outputs grew 4.3-fold, the one decode
    worker left saturated and the undo came after 250 s (stress draw 13, cell 149: static
    84.4 %, FluidPD 67.6 %; 91.8 % refused)."""
    return (
        f.gain > 0
        and f.gain >= (1.0 + margin) * f.cost
        and f.loss_after <= f.loss_before * (1 - margin)
        and f.saved >= max(1.0, f.noise)
    )


def donor_keeps_up(f: Forecast, margin: float = 0.0) -> bool:
    """Whether the donor phase carries the recent peak rate after the switch: its load ratio
    stays below 1 (``donor_after``), or, for a prefill pool that is past its TTFT capacity at
    that rate already (``donor_before >= 1``), its busy fraction does (``donor_busy_after``).

    The decode ratio is a throughput limit (streams a TPOT batch holds, KV slots), so past 1
    the decode pool falls behind. The prefill ratio is the busy fraction over the headroom the
    TTFT target leaves a prompt to queue, which long prompts make small (20K-token prompts
    under a 2 s TTFT: a pool of six busy 13-40 % read 1.5-2.7). Past 1 there, the pool misses
    deadlines it misses with or without the worker, and the loss (``CapacityModel.loss``,
    prompt by prompt) weighs those misses against the decode pool's; a switch that leaves it
    short of throughput still may not pass.

    ``margin`` asks for that much room: a ratio below ``1 / (1 + margin)``."""
    edge = 1.0 / (1.0 + margin)
    return f.donor_after < edge or (f.donor_before >= 1.0 and f.donor_busy_after < edge)


def overload_shared(f: Forecast, margin: float) -> bool:
    """Whether a switch whose prefill donor only the recent peak takes past capacity is
    still worth it because the split kept is past capacity at that peak too
    (``burst_before >= 1``): the arrivals are no burstier than Poisson's (``arrival_cv2 <=
    1``), the switch loses nothing at the peak beyond the noise of the misses
    (``loses_at_peak``), its donor is within capacity at the window's own rate by the margin
    (``donor_at_rate``), and both phases' forecasts rest on their own observation.

    Sparing a donor at a peak where the split kept fails anyway saves nothing there and
    gives up the gain everywhere else. 8.8K-token chats on Qwen3-30B-A3B/A100, 3 s TTFT,
    2P2D with its decode pool full: 1P3D's one prefill worker was at 0.87 of its capacity at
    the window's rate and 1.07 at the rate's upper bound, where 2P2D's decode pool was at
    1.61. Refused, 2P2D served 63.9 % (the static split's figure); taken at 115 s, 1P3D
    served 91.5 %.

    Only a prefill donor. A prefill pool past its headroom queues, and its wait tail counts
    what that costs. A decode pool at its KV edge stops admitting, and the requests that wait
    hold the KV they reserved (``clearly_worth``'s ``final``). Decode donors taken on the same
    terms won up to 22 pp at one seed of the matrix (long chats on 8B/H200, 1 s TTFT). At the
    next seed they put 9 cells below static - 1 pp (worst -8.25 pp: bursts of long
    generations on 8B/A100, 8 workers), each leaving its decode pool past its KV at the peak.

    Only where the arrivals come no more clustered than a Poisson stream's. There a peak is
    the noise of a steady rate; in clustered arrivals it is a burst, and the trace shows it
    again. Without this condition, prefill donors put 4 cells below static - 1 pp over the
    matrix's three seeds, all bursty traces with c_a^2 of 1.1-1.7 at the switch. The worst
    was 1P3D left by a P->D switch before a burst: long chats on Qwen3-30B-A3B/A100, 4
    workers at 0.6x, 57.2 -> 46.8 % (static 57.2 %).

    Such a switch bets that the peak, not the window's rate, is what passes its donor's
    capacity, so a donor saturated at the peak is what its forecast accepted and refutes
    nothing: ``FluidRolePolicy`` does not reverse it inside the reversal cooldown.

    ``overload_traded`` trades where the split kept fails at any rate the window allows and
    the receiver is observed saturated; this asks neither, and so it is not for the budget's
    last switch (``clearly_worth``'s ``final``), which no undo could follow."""
    return (
        f.prefill_donor
        and f.arrival_cv2 <= 1.0
        and f.donor_observed
        and f.receiver_observed
        and f.burst_before >= 1.0
        and not f.loses_at_peak
        and f.donor_at_rate * (1.0 + margin) <= 1.0
    )


def keeps_up_at_peak(f: Forecast, margin: float = 0.0) -> bool:
    """The donor carries the recent peak rate (``donor_keeps_up``, by ``margin``) and the
    switch loses nothing there beyond the noise (``Forecast.loses_at_peak``)."""
    return donor_keeps_up(f, margin) and not f.loses_at_peak


def overload_traded(f: Forecast, margin: float) -> bool:
    """Whether a switch that takes its donor past capacity at the recent peak rate is still
    worth it: the split kept is past capacity even at the lower bound of the rate
    (``before >= 1``), the split after the switch is within capacity at the window's own
    rate (``at_rate_after < 1``) or, where its receiver is not, its donor is by the margin
    (``donor_at_rate``), the switch lowers the worst phase's load at the peak rate by the
    margin, and the donor's forecast rests on its own observation (``donor_observed``).

    Keeping a split that fails at any rate the window allows (a mix shift half-way to outputs
    2.2 times longer left 6P2D with its decode KV full) to spare a donor that only the peak
    takes past capacity is the larger loss. Where the donor fails at the window's rate after
    the switch, trading one overload for the other only flips between them, and the lower
    bound of the rate alone does not say it holds: with 36 arrivals of 9K-token chats it was
    half the rate, and the trade moved the last-but-one decode worker of a long-chat
    deployment to prefill (28.5 -> 8.7 %). The split after the switch need not be within
    capacity at the window's rate, though: where only its receiver is past it there, the switch
    relieves the phase that fails and flips nothing. Asked of the whole split, the P->D switch
    of long generations of long prompts in bursts at 2.2x the mean (Qwen3-30B-A3B/A100, 2P2D,
    1.1 req/s) came at 453 s of a 726 s trace, with 2P2D's decode pool at 0.9-5.3 times its
    capacity at the rate's lower bound and 10-76 requests waiting for its KV while the two
    prefill workers were busy 6-29 % of the time; 1P3D was past capacity too, in its decode pool
    alone, and served more (static 16.4 %, FluidPD 22.9 %; switching at 81 s, 38.3 %; the
    oracle's 1P3D 38.1 %). The donor must clear its capacity there by the margin, since the
    forecast has an error: a prefill donor left at 0.99 of its capacity at the rate by a P->D
    switch of long chats (Qwen3-30B-A3B/A100, 4 workers) lost 1.4 pp against the 2P2D it left,
    and with the margin no cell of the matrix's three seeds is below static - 1 pp or quickly
    reversed that was not before. The trade rests on the model's comparison of two phases'
    overloads, which ``clearly_worth`` does not trust alone, so both phases must be observed:
    the receiver saturated (the caller's ``receiver_starved``), the donor's forecast calibrated
    by its own pressure."""
    return (
        f.donor_observed
        and f.before >= 1.0
        and (f.at_rate_after < 1.0 or f.donor_at_rate * (1.0 + margin) <= 1.0)
        # Both infinite (no split carries the peak) is no fall.
        and math.isfinite(f.burst_after)
        and f.burst_after * (1.0 + margin) <= f.burst_before
    )
