"""FluidRole policy: when to switch a worker's role, and which one (§IV-C2, eqs. 20-23)."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from fluidpd.core.policy_forecast import (
    CapacityModel,
    Demand,
    Forecast,
    Split,
    WorthBasis,
    clearly_worth,
    worth_basis,
)
from fluidpd.core.types import DrainMode, Role, RoleState

#: Seconds of decode-pool pressure the policy keeps for calibration (longer than any demand
#: window it is compared with).
DECODE_HISTORY_S = 600.0


class SwitchRule(StrEnum):
    """``predictive``: eqs. (22)-(23) propose, the gain/cost forecast decides and a wrong
    forecast is undone (issue #14); ``paper``: eqs. (22)-(23) with persistence and cooldowns."""

    PREDICTIVE = "predictive"
    PAPER = "paper"


@dataclass(frozen=True, slots=True)
class FluidRoleConfig:
    enabled: bool = True
    ppi_low: float = 0.6
    ppi_high: float = 1.0
    dpi_load_high: float = 0.6
    dpi_adm_high: float = 0.2
    #: Seconds between control observations.
    interval_s: float = 1.0
    #: Observation window for PPI^95 (eq. 20).
    window_s: float = 10.0
    percentile: float = 95.0
    #: Consecutive agreeing intervals before a switch is committed.
    n_persist: int = 3
    #: Quiet time after a switch completes before another is considered.
    cooldown_s: float = 5.0
    #: Longer quiet time before switching back the opposite way (beyond the paper; like the
    #: HPA's scale-down stabilization window): under bursty load, capacity moved towards the
    #: phase that just starved should not leave again in the next lull.
    reversal_cooldown_s: float = 300.0
    #: ...unless the phase the reversal would help is saturated (decode KV this fully
    #: committed, or prefill this far past its deadlines): then the previous switch went too
    #: far, and waiting out the window would only starve that phase longer.
    dpi_adm_saturated: float = 0.95
    ppi_saturated: float = 2.0
    #: ...and, where the prefill workers report it, their measured busy fraction this high:
    #: requests that wait for decode KV (reserved at dispatch) pass their deadlines in the
    #: prefill queue too, and a pool that is idle part of the time is not short of workers.
    busy_saturated: float = 0.9
    min_prefill: int = 1
    min_decode: int = 1
    #: D->P drain: ``migrate`` (our default) or the paper's ``wait``.
    drain_mode: DrainMode = DrainMode.MIGRATE
    switch_rule: SwitchRule = SwitchRule.PREDICTIVE
    #: Predictive rule: seconds over which a switch's gain is counted (the split is expected
    #: to hold at least this long, given the switch budget), and how clearly it must win.
    horizon_s: float = 120.0
    gain_margin: float = 0.1
    #: After a switch completes, when the observed pressure is compared with the forecast;
    #: a wrong forecast is undone and its direction frozen this long.
    settle_s: float = 30.0
    freeze_s: float = 600.0
    #: Anti-flap: at most this many switches start in any ``budget_window_s`` (0 = no limit);
    #: an undo of a wrong switch is not held back by it.
    switch_budget: int = 2
    budget_window_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 <= self.ppi_low <= self.ppi_high:
            raise ValueError("need 0 <= ppi_low <= ppi_high")
        if self.interval_s <= 0 or self.window_s < self.interval_s:
            raise ValueError("need 0 < interval_s <= window_s")
        if self.n_persist < 1 or self.cooldown_s < 0 or self.reversal_cooldown_s < 0:
            raise ValueError("need n_persist >= 1 and non-negative cooldowns")
        if not 0 < self.dpi_adm_saturated <= 1:
            raise ValueError("dpi_adm_saturated must be in (0, 1]")
        if self.ppi_saturated < self.ppi_high:
            raise ValueError("ppi_saturated must be >= ppi_high")
        if not 0 < self.busy_saturated <= 1:
            raise ValueError("busy_saturated must be in (0, 1]")
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError("each role keeps at least one worker")
        if not 0 < self.percentile <= 100:
            raise ValueError("percentile must be in (0, 100]")
        if self.horizon_s <= 0 or not 0 <= self.gain_margin < 1:
            raise ValueError("need horizon_s > 0 and 0 <= gain_margin < 1")
        if self.settle_s < 0 or self.freeze_s < 0:
            raise ValueError("need non-negative settle_s and freeze_s")
        if self.switch_budget < 0 or self.budget_window_s <= 0:
            raise ValueError("need switch_budget >= 0 and budget_window_s > 0")


@dataclass(frozen=True, slots=True)
class WorkerSignals:
    """What the controller reads from one worker each interval (a /pressure report)."""

    worker: str
    role: Role
    state: RoleState
    queue_ppi: float = 0.0
    dpi_load: float = 0.0
    dpi_adm: float = 0.0
    #: Drain-cost proxies: seconds of remaining prefill work plus pending transfers for a
    #: prefill worker (P->D); active decode requests for a decode worker (D->P).
    drain_cost: float = 0.0
    #: A prefill worker's measured busy fraction over the recent window (None: not measured).
    busy: float | None = None
    #: Requests waiting for KV room on a decode worker.
    kv_waiting: int = 0


class Recommendation(StrEnum):
    NONE = "none"
    D_TO_P = "decode->prefill"
    P_TO_D = "prefill->decode"
    #: Both phases are pressured: moving capacity would only move the bottleneck.
    NEEDS_CAPACITY = "needs-capacity"


@dataclass(frozen=True, slots=True)
class PoolPressure:
    ppi_bar: float
    dpi_load_bar: float
    dpi_adm_bar: float
    #: Active pool sizes, for projecting a pool's pressure after it gives up one worker.
    n_prefill: int = 1
    n_decode: int = 1
    #: Mean measured busy fraction of the active prefill workers (None unless all report it).
    prefill_busy: float | None = None
    #: Mean requests per active decode worker waiting for its KV.
    decode_waiting: float = 0.0


@dataclass(frozen=True, slots=True)
class SwitchDecision:
    worker: str
    source: Role
    target: Role
    drain_mode: DrainMode
    pressure: PoolPressure
    #: The predictive rule's forecast behind the switch (None under the paper rule).
    forecast: Forecast | None = None
    #: This switch undoes the previous one, whose forecast the observed pressure refuted.
    undo: bool = False


class _Gate(StrEnum):
    """What the reversal cooldown lets through (``FluidRolePolicy._reversal_gate``)."""

    OPEN = "open"
    #: Only a switch whose forecast wins with its donor keeping up.
    SAFE = "safe"
    SHUT = "shut"


@dataclass(frozen=True, slots=True)
class _Check:
    """A switch whose forecast is to be checked against observation once it has settled."""

    source: Role
    direction: Recommendation
    at: float
    #: When the switch finished (inf until then): the reversal cooldown counts from it, as
    #: ``_stabilizing``'s does and as the robustness suite times a reversal.
    ended: float = math.inf


def decode_saturated(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """Decode KV fully committed or the decode batch past N_TPOT."""
    return p.dpi_adm_bar >= cfg.dpi_adm_saturated or p.dpi_load_bar >= 1.0


def prefill_saturated(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """The prefill queue far past its deadlines, and its workers busy (where they report it).

    PPI-bar alone grows without bound once deadlines pass, whatever held the requests back:
    behind a saturated decode pool, prompts wait for decode KV in the prefill queue while the
    prefill workers idle (PPI-bar 440-1,900 at a busy fraction of 0.2-0.3 right after a P->D
    switch that had relieved decode), and reading that as prefill saturation undoes the
    switch that helped."""
    if p.ppi_bar < cfg.ppi_saturated:
        return False
    return p.prefill_busy is None or p.prefill_busy >= cfg.busy_saturated


def donor_starved(source: Role, p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """The phase that gave up a worker is saturated and the phase that got it is not: the
    forecast that the donor could spare one was wrong.

    When both are saturated the observation does not refute the switch: decode KV is reserved
    at dispatch, so a prefill queue far past its deadlines fills DPI_adm with requests that
    wait for *prefill* (the decode batch can be idle), and undoing the switch would only make
    that queue longer; the deployment needs capacity, not the other split."""
    if source is Role.DECODE:
        return decode_saturated(p, cfg) and not prefill_saturated(p, cfg)
    return prefill_saturated(p, cfg) and not decode_saturated(p, cfg)


def windowed_percentile(samples: Iterable[float], percentile: float) -> float:
    """PPI^95(p): the given percentile of one worker's queue PPI over the window (eq. 20)."""
    # numpy's linear-interpolation percentile by hand: windows hold about ten samples, and
    # np.percentile's fixed cost was most of a simulated control interval.
    values = sorted(samples)
    if not values:
        return 0.0
    rank = (len(values) - 1) * percentile / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def prefill_pool_pressure(per_worker_percentiles: Iterable[float]) -> float:
    """PPI-bar = max over prefill workers of PPI^95(p), eq. (20)."""
    return max(per_worker_percentiles, default=0.0)


def decode_pool_pressure(loads: Sequence[float], adms: Sequence[float]) -> tuple[float, float]:
    """(DPI-bar_load, DPI-bar_adm): decode-pool averages, eq. (21)."""
    if not loads:
        return 0.0, 0.0
    return sum(loads) / len(loads), sum(adms) / len(adms)


def wants_decode_to_prefill(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """PPI-bar > PPI^high and DPI-bar_load < DPI_load^high, eq. (22)."""
    return p.ppi_bar > cfg.ppi_high and p.dpi_load_bar < cfg.dpi_load_high


def wants_prefill_to_decode(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """DPI-bar_adm > DPI_adm^high and PPI-bar < PPI^low, eq. (23)."""
    return p.dpi_adm_bar > cfg.dpi_adm_high and p.ppi_bar < cfg.ppi_low


def _shrunk(value: float, pool: int) -> float:
    """A pool-average pressure after the pool loses one worker (its load spreads over the
    rest); infinite for a pool of one."""
    return value * pool / (pool - 1) if pool > 1 else float("inf")


def decode_can_spare_one(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """Eq. (22)'s decode-side test applied to the decode pool as it will be after the switch.

    The paper asks whether the decode pool "can safely relinquish one worker" and tests the
    current DPI-bar_load; we test the projected one, so that a chain of D->P switches stops
    before the remaining decode workers are pushed past the threshold, and we also require
    that the remaining workers could hold the KV already committed (projected DPI_adm < 1):
    committed KV becomes active load within a hand-off (beyond the paper).
    """
    return (
        _shrunk(p.dpi_load_bar, p.n_decode) < cfg.dpi_load_high
        and _shrunk(p.dpi_adm_bar, p.n_decode) < 1.0
    )


def prefill_can_spare_one(p: PoolPressure, cfg: FluidRoleConfig) -> bool:
    """Eq. (23)'s prefill-side test on the prefill pool as it will be after the switch."""
    return _shrunk(p.ppi_bar, p.n_prefill) < cfg.ppi_low


def recommend(p: PoolPressure, cfg: FluidRoleConfig) -> Recommendation:
    """The switch (or capacity request) the current pool pressure calls for."""
    if wants_decode_to_prefill(p, cfg) and decode_can_spare_one(p, cfg):
        return Recommendation.D_TO_P
    if wants_prefill_to_decode(p, cfg) and prefill_can_spare_one(p, cfg):
        return Recommendation.P_TO_D
    if p.ppi_bar > cfg.ppi_high and not decode_can_spare_one(p, cfg):
        return Recommendation.NEEDS_CAPACITY
    return Recommendation.NONE


@dataclass(frozen=True, slots=True)
class _Readings:
    """What a switch's forecast reads (``FluidRolePolicy._readings``): the demand, the split,
    the donor, and the observations that calibrate the model (``CapacityModel.forecast``)."""

    demand: Demand
    split: Split
    source: Role
    observed: float | None
    ppi_bar: float
    prefill_busy: float | None
    filling: float | None
    streams: float | None


@dataclass(slots=True)
class FluidRolePolicy:
    """Stateful FluidRole controller logic; the harness feeds it one observation per interval.

    It keeps each prefill worker's PPI window, counts consecutive agreeing recommendations,
    enforces one switch at a time, the cooldown and the per-role minimums, and picks the
    cheapest-to-drain candidate.
    """

    cfg: FluidRoleConfig = field(default_factory=FluidRoleConfig)
    #: The profile's capacity model; the predictive rule needs it and a demand observation.
    model: CapacityModel | None = None
    _windows: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    _streak: int = 0
    _last: Recommendation = Recommendation.NONE
    _cooldown_until: float = float("-inf")
    _last_switch_end: float = float("-inf")
    _last_direction: Recommendation = Recommendation.NONE
    #: The demand the last switch was decided on (None under the paper's rule).
    _switch_demand: Demand | None = None
    _switching: str | None = None
    last_pressure: PoolPressure = PoolPressure(0.0, 0.0, 0.0)
    last_recommendation: Recommendation = Recommendation.NONE
    #: The forecast last asked for, or what it is computed from when it was not needed
    #: (``last_forecast``).
    _last_forecast: Forecast | _Readings | None = None
    _starts: deque[float] = field(default_factory=deque)
    #: When the switches in the budget's window finished: flapping is counted by when
    #: switches end, and a drain can outlast the next switch's.
    _ends: deque[float] = field(default_factory=deque)
    _check: _Check | None = None
    _undo_due: _Check | None = None
    #: The last switch was taken on ``overload_shared`` (its donor past capacity at a peak
    #: where the split it left fails too): nothing reverses it inside the reversal cooldown.
    _shared_overload: bool = False
    #: A checked switch still watched until the end of its reversal cooldown (``_watch``),
    #: and since when its donor has been starved without a break.
    _watch: _Check | None = None
    _starved_since: float | None = None
    _frozen_until: dict[Recommendation, float] = field(default_factory=dict)
    #: The decode pool's pressure (``_note_decode``: max(DPI-bar_load, DPI-bar_adm) but behind
    #: a saturated prefill pool), per interval since its size last changed: what calibrates
    #: the forecast's decode model.
    _decode_seen: deque[tuple[float, float]] = field(default_factory=deque)
    #: DPI-bar_load alone over the same intervals: the decode pool's own streams, which a
    #: decode donor is checked on too (``_streams_observed``).
    _streams_seen: deque[tuple[float, float]] = field(default_factory=deque)
    #: Switches the forecast refused, and wrong forecasts undone (for reports).
    refused: int = 0
    undone: int = 0

    def _record(self, now: float, workers: Sequence[WorkerSignals]) -> PoolPressure:
        horizon = now - self.cfg.window_s
        percentiles: list[float] = []
        busy: list[float | None] = []
        live = set()
        for w in workers:
            if w.role is not Role.PREFILL or w.state is not RoleState.ACTIVE:
                continue
            live.add(w.worker)
            busy.append(w.busy)
            window = self._windows.setdefault(w.worker, deque())
            window.append((now, w.queue_ppi))
            while window and window[0][0] <= horizon:
                window.popleft()
            percentiles.append(windowed_percentile((v for _, v in window), self.cfg.percentile))
        for gone in set(self._windows) - live:
            del self._windows[gone]
        decode = [w for w in workers if w.role is Role.DECODE and w.state is RoleState.ACTIVE]
        load, adm = decode_pool_pressure([w.dpi_load for w in decode], [w.dpi_adm for w in decode])
        measured = [b for b in busy if b is not None]
        complete = bool(busy) and len(measured) == len(busy)
        prefill_busy = sum(measured) / len(measured) if complete else None
        waiting = sum(w.kv_waiting for w in decode) / len(decode) if decode else 0.0
        return PoolPressure(
            prefill_pool_pressure(percentiles),
            load,
            adm,
            len(percentiles),
            len(decode),
            prefill_busy,
            waiting,
        )

    def observe(
        self, now: float, workers: Sequence[WorkerSignals], demand: Demand | None = None
    ) -> SwitchDecision | Recommendation:
        """One control interval. Returns a committed switch, or the standing recommendation.

        ``Recommendation.NEEDS_CAPACITY`` is returned once it has persisted ``n_persist``
        intervals; it is advice for an autoscaler, not an action of FluidRole. ``demand`` is
        what arrived over the recent window; the predictive rule needs it (and ``model``),
        and without either it decides as the paper does.
        """
        pressure = self._record(now, workers)
        self.last_pressure = pressure
        self._note_decode(now, pressure, demand)
        predictive = self._predictive(demand)
        undo = self._verify(now, pressure, workers, demand if predictive else None)
        if undo is not None:
            return undo
        rec = recommend(pressure, self.cfg)
        if predictive and rec in (Recommendation.NONE, Recommendation.NEEDS_CAPACITY):
            assert demand is not None
            proposed = self._proposal(now, pressure, demand, rec is Recommendation.NONE)
            if proposed is not Recommendation.NONE:
                rec = proposed
        self.last_recommendation = rec
        self._streak = self._streak + 1 if rec is self._last else 1
        self._last = rec
        if rec is Recommendation.NONE or self._streak < self.cfg.n_persist:
            return Recommendation.NONE
        if rec is Recommendation.NEEDS_CAPACITY:
            return rec
        if not self.cfg.enabled or self._switching is not None or now < self._cooldown_until:
            return Recommendation.NONE
        if any(w.state is not RoleState.ACTIVE for w in workers):
            return Recommendation.NONE
        gate = self._reversal_gate(rec, pressure, now, demand if predictive else None)
        if gate is _Gate.SHUT:
            return Recommendation.NONE
        if now < self._frozen_until.get(rec, float("-inf")) or not self._budget_left(now):
            return Recommendation.NONE
        source = Role.DECODE if rec is Recommendation.D_TO_P else Role.PREFILL
        forecast, basis = None, None
        if predictive:
            assert demand is not None
            if not demand.reliable:
                return Recommendation.NONE
            forecast = self._considered(now, pressure, demand, source)
            if forecast is not None:
                trade = gate is not _Gate.SAFE
                basis = self._worth(now, forecast, pressure, source, trade=trade)
            if basis is None:
                # The streak is kept: the forecast is asked again next interval while the
                # recommendation persists, so that a switch does not depend on where the
                # refusals fell (refused at 3 s and 6 s, a count reset by each refusal
                # never reached the forecast that won at 4-5 s).
                self.refused += 1
                return Recommendation.NONE
        decision = self._commit(
            now,
            workers,
            source,
            rec,
            pressure,
            forecast,
            demand if predictive else None,
            shared=basis is WorthBasis.SHARED,
        )
        if decision is not None and forecast is not None:
            self._check, self._watch = _Check(source, rec, math.inf), None
        return decision or Recommendation.NONE

    @property
    def last_forecast(self) -> Forecast | None:
        """The forecast of the switch last considered (None before any): computed when asked
        where the policy itself did not need it (``CapacityModel.may_save`` failed)."""
        if isinstance(self._last_forecast, _Readings):
            self._last_forecast = self._forecast(self._last_forecast)
        return self._last_forecast

    def _considered(
        self, now: float, p: PoolPressure, demand: Demand, source: Role
    ) -> Forecast | None:
        """The forecast of moving one ``source`` worker, kept as ``last_forecast``; None where
        the switch may save no request (``_may_save``: then no forecast wins, and the one
        ``last_forecast`` reports is computed only if read)."""
        readings = self._readings(now, p, demand, source)
        self._last_forecast = readings
        if not self._may_save(readings):
            return None
        forecast = self._last_forecast = self._forecast(readings)
        return forecast

    def _forecast(self, r: _Readings) -> Forecast:
        """The model's forecast of moving one ``r.source`` worker to the other role."""
        assert self.model is not None
        return self.model.forecast(
            r.demand,
            r.split,
            r.source,
            self.cfg.horizon_s,
            self.cfg.drain_mode is DrainMode.MIGRATE,
            r.observed,
            r.ppi_bar,
            r.prefill_busy,
            r.filling,
            self.cfg.gain_margin,
            r.streams,
        )

    def _may_save(self, r: _Readings) -> bool:
        """``CapacityModel.may_save`` of the switch ``_forecast`` would forecast: without it no
        forecast of that switch is worth taking (``_worth``), and it costs a fraction of one."""
        assert self.model is not None
        return self.model.may_save(
            r.demand,
            r.split,
            r.source,
            self.cfg.horizon_s,
            r.observed,
            r.ppi_bar,
            r.prefill_busy,
            r.filling,
        )

    def _readings(self, now: float, p: PoolPressure, demand: Demand, source: Role) -> _Readings:
        """What the forecast of moving one ``source`` worker reads now."""
        assert self.model is not None
        # The decode pool's pressure lags its demand (streams take a while to fill it), so it
        # calibrates the forecast only once the pool has had time to fill since the first
        # arrival (``fill_seconds``, or a whole demand window) and the last switch has settled.
        fill = self.model.fill_seconds(demand, p.n_decode)
        filled = demand.full_window or demand.seen_s >= fill
        # Before then, a reading above the model is still evidence the model is low.
        settled = filled and now >= self._last_switch_end + self.cfg.settle_s
        # When the pool could first have filled: ``fill`` after the first arrival, which the
        # demand dates until its window is full.
        filled_at = -math.inf if demand.full_window else now - demand.seen_s + fill
        # The way back of a D->P switch is no receiver's bet (``_decode_observed``).
        receiving = source is Role.PREFILL and self._last_direction is not Recommendation.D_TO_P
        observed = self._decode_observed(now, demand.seen_s, receiving, filled_at)
        return _Readings(
            demand,
            Split(p.n_prefill, p.n_decode),
            source,
            observed if settled else None,
            p.ppi_bar,
            p.prefill_busy,
            None if settled else observed,
            self._streams_observed(now, demand.seen_s) if source is Role.DECODE else None,
        )

    def _streams_observed(self, now: float, span_s: float) -> float | None:
        """The decode pool's streams (DPI-bar_load alone) as a donor is read: its latest
        interval, or the mean since the pool last changed size (within ``span_s``) if that is
        higher. ``CapacityModel.forecast`` checks a decode donor on them (``observed_streams``)."""
        return self._spell(self._streams_seen, now, span_s)

    def _note_decode(self, now: float, p: PoolPressure, demand: Demand | None = None) -> None:
        """Keeps this interval's decode-pool pressure, dropping what precedes the pool's
        last size change or ``DECODE_HISTORY_S``.

        DPI_adm cannot pass 1: what a full pool cannot admit waits for its KV. So the KV the
        waiting requests would commit (at the demand's mean request, by the share of the TTFT
        slack their wait takes: ``CapacityModel.waiting_pressure``) is added to it, and an
        overloaded pool reads past 1, by more the longer its queue. Read as 1, a decode
        worker left alone by a D->P switch ran at 1.00 for four minutes while its queue grew
        to 23 requests (every request missing TTFT), and the forecast saw no gain in moving a
        worker back.

        Behind a saturated prefill pool (``prefill_saturated``) DPI_adm is not the decode
        pool's own load: KV is reserved at dispatch, so the prompts queued for prefill hold
        it, and requests wait for KV that the prefill backlog holds. There the pool reads as
        its streams (DPI_load) plus the KV the model's requests hold while they wait out the
        TTFT budget and prefill (``CapacityModel.reserved_kv``), at most DPI_adm, and its
        waiting requests add nothing. Read as DPI_adm, a burst of long chats (Llama-3.1-8B/
        A100, 4P4D, 2 s TTFT, the matrix's seed 2) put the four decode workers at 2-4 times
        the model while their streams held 0.2-0.3 of their KV; the D->P switch to the
        oracle's 5P3D was refused 100 times, its three decode workers read past capacity at
        the peak (static 32.8 %, FluidPD 32.8 %; 50.9 % read so, switching at 184 s; 5P3D
        59.5 %)."""
        value = max(p.dpi_load_bar, p.dpi_adm_bar)
        if self.model is not None and demand is not None:
            if prefill_saturated(p, self.cfg):
                reserved = self.model.reserved_kv(demand, p.n_decode)
                value = max(p.dpi_load_bar, min(p.dpi_adm_bar, p.dpi_load_bar + reserved))
            elif p.decode_waiting > 0:
                waiting = self.model.waiting_pressure(demand, p.decode_waiting, p.n_decode)
                value = max(value, p.dpi_adm_bar + waiting)
        oldest = max(now - DECODE_HISTORY_S, self._last_switch_end)
        for seen, reading in ((self._decode_seen, value), (self._streams_seen, p.dpi_load_bar)):
            # Kept in time order (``_spell`` reads from the newest end): readings stamped
            # after ``now`` (a wall clock stepped back) go.
            while seen and seen[-1][0] > now:
                seen.pop()
            seen.append((now, reading))
            # ``seen`` may empty: a wall clock stepped back puts ``now`` before the last switch.
            while seen and seen[0][0] < oldest:
                seen.popleft()

    def _decode_observed(
        self, now: float, span_s: float, receiving: bool = False, filled_at: float = -math.inf
    ) -> float | None:
        """The decode pool's pressure for calibration: its recent spell, or the mean over the
        demand's window (``span_s``, since the pool last changed size) if that is higher.

        The forecast models the pool's mean load at the window's mean rate. One interval's
        pool average swings with every burst and lull: an idle pool in a gap of clustered
        arrivals reads 0, which scaled the decode model down fourfold and sent the
        last-but-one decode worker to prefill, so a lull never reads below the window's mean.

        A spell busier than the mean is kept, read over a span that depends on which side of
        the switch the decode pool is on. As the donor (D->P) it must carry the spell, so the
        latest interval counts as it is (a burst of long generations starting at 0.22 against
        a window mean of about 0.1). As the receiver (P->D, ``receiving``) the spell argues
        for the switch, so it is read as the prefill pool's pressure is, over ``window_s``
        (eq. (20)'s window): one interval of a burst is no evidence of the load the next
        ``horizon_s`` will bring. A lone decode worker of short outputs (26 tokens; 1B/H200,
        gamma arrivals, c_a^2 6.8) read 1.13 in one interval (DPI_adm 0.96 and the KV of 2
        waiting requests) against 0.55 over 10 s, while static 3P1D missed nothing; the P->D
        switch on that reading left two prefill workers to a burst of longer prompts (-14.8 pp
        against static). A decode pool of long outputs fills over many intervals, so its
        10 s mean follows a real rise (Qwen3-30B-A3B long chats, 0.47 -> 0.76 over 10 s with
        the latest interval at 1.06: the switch still goes, 63.9 -> 91.6 %).

        Nor does the receiver's window reach back before ``filled_at``, when the pool could
        first have filled: readings of a pool still filling from empty sit below its level,
        and they held back by 3 s the P->D switch that four decode workers, full 3 s into a
        9 s trace at 335 req/s, asked for (stress draw 20, cell 88: 100.0 -> 88.8 %).

        A pool that the last switch took a worker from is read as a donor in both directions
        (the caller's ``receiving`` False): a P->D switch there goes back to the split before,
        and the pool's spell is evidence against the forecast that let the worker go, not a
        bet on load to come. Read over the window, the way back of a D->P switch of long chats
        (Llama-3.1-8B/H100, 4 workers, 1 s TTFT), its one decode worker full with 26 requests
        waiting for its KV, came 77 s late, when only the starvation undo could take it, since
        the prefill donor was by then at its edge (static 62.4 %, FluidPD 52.1 %; 64.2 % read
        at the latest interval)."""
        return self._spell(self._decode_seen, now, span_s, receiving, filled_at)

    def _spell(
        self,
        seen: deque[tuple[float, float]],
        now: float,
        span_s: float,
        receiving: bool = False,
        filled_at: float = -math.inf,
    ) -> float | None:
        """``seen``'s recent spell (its latest interval; a receiver's window from
        ``filled_at``) or its mean since the pool last changed size within ``span_s``,
        whichever is higher (``_decode_observed``)."""
        since = max(now - span_s, self._last_switch_end)
        # From the newest end: ``seen`` is in time order and holds up to DECODE_HISTORY_S.
        kept = list(itertools.takewhile(lambda item: item[0] >= since, reversed(seen)))
        if not kept:
            return None
        kept.reverse()
        values = [v for _, v in kept]
        recent = values[-1:]
        if receiving:
            start = max(now - self.cfg.window_s, filled_at)
            recent = [v for t, v in kept if t >= start] or recent
        return max(sum(recent) / len(recent), sum(values) / len(values))

    def _proposal(
        self, now: float, p: PoolPressure, demand: Demand, decode_may_give: bool = True
    ) -> Recommendation:
        """What the forecast itself proposes when eqs. (22)-(23) propose no switch: the switch
        whose forecast clearly wins (the larger net gain if both do). The paper's thresholds
        only see a queue already past its deadlines or KV already committed; a split within
        capacity that still misses a share of its deadlines (a prefill queue of widely spread
        long prompts at PPI-bar 0.5) is seen only by the forecast.

        Where they read both phases as pressured (``NEEDS_CAPACITY``), the decode pool has
        failed eq. (22)'s test of whether it can spare a worker, so only P->D is asked
        (``decode_may_give`` False). PPI-bar past the deadlines there need not mean the
        prefill workers are short: prompts wait for decode KV reserved at dispatch. A
        long-chat deployment (Qwen3-30B-A3B/A100, 4P4D, 1 s TTFT) sat there for two minutes
        with its prefill workers busy half of the time and the decode queue growing, and
        never asked the forecast (static 25.8 %, FluidPD 25.8 %, 3P5D 45.5 %)."""
        if not demand.reliable:
            return Recommendation.NONE
        best, best_net = Recommendation.NONE, 0.0
        for source, rec, keep, pool in (
            (Role.DECODE, Recommendation.D_TO_P, self.cfg.min_decode, p.n_decode),
            (Role.PREFILL, Recommendation.P_TO_D, self.cfg.min_prefill, p.n_prefill),
        ):
            if pool <= keep or (source is Role.DECODE and not decode_may_give):
                continue
            readings = self._readings(now, p, demand, source)
            if not self._may_save(readings):
                continue
            f = self._forecast(readings)
            if self._worth(now, f, p, source) is not None and f.net > best_net:
                best, best_net = rec, f.net
        return best

    def _predictive(self, demand: Demand | None) -> bool:
        return (
            self.cfg.switch_rule is SwitchRule.PREDICTIVE
            and self.model is not None
            and demand is not None
        )

    def _budget_left(self, now: float) -> bool:
        """Anti-flap budget: fewer than ``switch_budget`` switches started, and fewer ended,
        in the window."""
        return self.cfg.switch_budget == 0 or self._in_window(now) < self.cfg.switch_budget

    def _in_window(self, now: float) -> int:
        """Switches in the budget's window: the more of those that started and those that
        ended in it. Counted by starts alone, a switch whose drain took 1.85 s and a switch
        started 600 s after the one before it (ending 0.05 s later) put three ends in 600 s
        (an hour-long trace of phases, 8 workers)."""
        for times in (self._starts, self._ends):
            while times and times[0] <= now - self.cfg.budget_window_s:
                times.popleft()
        return max(len(self._starts), len(self._ends))

    def _commit(
        self,
        now: float,
        workers: Sequence[WorkerSignals],
        source: Role,
        rec: Recommendation,
        pressure: PoolPressure,
        forecast: Forecast | None,
        demand: Demand | None,
        undo: bool = False,
        shared: bool = False,
    ) -> SwitchDecision | None:
        candidate = self.pick_candidate(workers, source)
        if candidate is None:
            return None
        self._shared_overload = shared
        self._switching = candidate.worker
        self._last_direction = rec
        self._switch_demand = demand
        self._streak = 0
        self._starts.append(now)
        mode = self.cfg.drain_mode if source is Role.DECODE else DrainMode.WAIT
        return SwitchDecision(
            candidate.worker, source, source.other, mode, pressure, forecast, undo
        )

    def _verify(
        self,
        now: float,
        p: PoolPressure,
        workers: Sequence[WorkerSignals],
        demand: Demand | None = None,
    ) -> SwitchDecision | None:
        """Compare a settled switch's donor phase with its forecast; freeze the direction of a
        refuted one and undo it, if the forecast (``demand`` given), now calibrated by what
        the switch brought, says the way back clearly wins. A donor saturated by what came
        after the switch (a shift to longer prompts, a burst that overloads both splits) is
        no reason to reverse it: the undo would pay a drain inside the reversal cooldown for
        a split that is no better."""
        check = self._check
        if check is not None and self._switching is None and now >= check.at:
            self._check = None
            self._watch, self._starved_since = check, None
            if donor_starved(check.source, p, self.cfg):
                self._frozen_until[check.direction] = now + self.cfg.freeze_s
                # A switch taken on a shared overload waits out the cooldown (its donor
                # saturated at the peak is what its forecast accepted).
                # An undo spends the switch budget as any switch does (the flapping bar counts
                # every switch); with none left, the watch undoes it once the budget allows.
                if (
                    not self._shared_overload
                    and self._budget_left(now)
                    and (demand is None or self._back_wins(now, p, demand, check.source.other))
                ):
                    self._undo_due, self._watch = check, None
        elif self._watch is not None and self._switching is None and self._undo_due is None:
            self._watch_donor(now, p, demand)
        due = self._undo_due
        if due is None or self._switching is not None:
            return None
        if any(w.state is not RoleState.ACTIVE for w in workers):
            return None
        back = Recommendation.P_TO_D if due.source is Role.DECODE else Recommendation.D_TO_P
        decision = self._commit(now, workers, due.source.other, back, p, None, demand, undo=True)
        if decision is not None:
            self._undo_due = None
            self.undone += 1
        return decision

    def _watch_donor(self, now: float, p: PoolPressure, demand: Demand | None = None) -> None:
        """Watches a checked switch's donor until the next switch: a donor starved without a
        break for ``settle_s`` refutes the switch by observation, and it is undone whatever
        the forecast says, within the switch budget: at once where requests wait for the
        donor under a load no heavier than the switch's forecast checked it at
        (``_within_forecast``), else once the switch is older than the reversal cooldown.

        The forecast counts a gain at the lower bound of the rate and checks the donor at the
        upper one, so that a switch away from a working split needs clear evidence; the same
        bounds also make staying away look safe. A decode worker left alone by a D->P switch
        filled as the rate rose by a fifth, with DPI_adm 0.95-1.00 and the prefill workers
        busy half of the time; every request missed TTFT for four minutes while the forecast
        at the rate's lower bound put the way back at a larger loss (static 70.2 %, FluidPD
        59.1 %). The check at ``settle_s`` after the switch sees only what the switch itself
        did; this sees what the load brought after it, which the undo must answer too.

        Waiting out the cooldown there as well (so that no undo counted as a quick reversal)
        left a decode worker, checked at 0.78 of its capacity at 1.4 req/s, missing every
        request from 160 s to 378 s at 1.2-1.5 req/s (long chats, Qwen3-14B/A100, 4 workers,
        3 s TTFT: static 70.8 %, FluidPD 48.5 %). The undo freezes the switch's direction,
        so the split does not flap back.

        A switch taken on a shared overload (``overload_shared``) is refuted only once it is
        older than the cooldown: its forecast accepted a donor past capacity at the peak."""
        watch = self._watch
        assert watch is not None
        if not donor_starved(watch.source, p, self.cfg):
            self._starved_since = None
            return
        if self._starved_since is None:
            self._starved_since = now
        old = now >= watch.ended + self.cfg.reversal_cooldown_s
        # Inside the cooldown only on the plainest evidence: requests held back by the donor
        # (waiting for decode KV; a prefill donor is saturated only with its queue far past
        # its deadlines and its workers busy), under the load the switch was checked at.
        held_back = watch.source is Role.PREFILL or p.decode_waiting > 0
        refuted = old or (
            held_back and not self._shared_overload and self._within_forecast(demand, watch.source)
        )
        if now - self._starved_since >= self.cfg.settle_s and refuted and self._budget_left(now):
            self._frozen_until[watch.direction] = now + self.cfg.freeze_s
            self._undo_due, self._watch = watch, None

    def _back_wins(self, now: float, p: PoolPressure, demand: Demand, source: Role) -> bool:
        """Whether the forecast of moving a ``source`` worker back clearly wins."""
        if not demand.reliable:
            return False
        forecast = self._considered(now, p, demand, source)
        # An undo never trades one phase's overload for the other's: it must keep its donor
        # within capacity.
        return forecast is not None and clearly_worth(forecast, self.cfg.gain_margin)

    def _worth(
        self, now: float, f: Forecast, p: PoolPressure, source: Role, trade: bool = True
    ) -> WorthBasis | None:
        """``worth_basis``, told whether the phase that would get the worker is observed
        saturated while the donor is not (never, with ``trade`` False: the donor must keep
        up), and whether the switch may share an overload (not with ``trade`` False, nor
        where it would reverse the last switch inside the reversal cooldown)."""
        starved = self._receiver_starved(p, source, trade)
        final = self._final_away(now, source)
        rec = Recommendation.D_TO_P if source is Role.DECODE else Recommendation.P_TO_D
        share = trade and not self._reverses_within_cooldown(now, rec)
        return worth_basis(f, self.cfg.gain_margin, starved, final, share)

    def _receiver_starved(self, p: PoolPressure, source: Role, trade: bool) -> bool:
        """Whether the phase a ``source`` switch would give the worker to is observed
        saturated while the donor is not (never with ``trade`` False)."""
        return trade and donor_starved(source.other, p, self.cfg)

    def _reverses_within_cooldown(self, now: float, rec: Recommendation) -> bool:
        """Whether ``rec`` now would reverse the last switch inside the reversal cooldown
        (a quick reversal, by the robustness suite's flapping bar)."""
        reverses = self._last_direction not in (Recommendation.NONE, rec)
        return reverses and now < self._last_switch_end + self.cfg.reversal_cooldown_s

    def _final_away(self, now: float, source: Role) -> bool:
        """Whether a ``source`` switch now would take a decode worker away with the last switch
        the budget allows in its window, without reversing the last switch: one that moves
        the split further from where it was, with no undo left to bring it back.

        Only a decode donor: at the edge of its KV a decode pool stops admitting, and the
        requests that wait hold the KV they reserved, which the forecast's occupancy tail
        (``CapacityModel.decode_miss``) understates; a prefill pool past its headroom queues,
        which its wait tail counts. Held to the check, the second P->D switch of a prefill
        pool of short prompts (5P1D -> 4P2D -> 3P3D at 74 req/s, the best split by far) came
        29 s later (stress draw 5, cell 74: 73.8 -> 15.7 %, static 0.2 %). A reversal
        returns to the split the last switch left, which served before it; held to the
        check, the reversal of a D->P switch whose outputs then grew 2.17-fold came 31 s
        later (stress draw 3, cell 4: 72.1 -> 66.5 %, static 83.1 %)."""
        if source is not Role.DECODE:
            return False
        budget = self.cfg.switch_budget
        reverses = self._last_direction is Recommendation.P_TO_D
        return budget > 0 and self._in_window(now) == budget - 1 and not reverses

    def _reversal_gate(
        self, rec: Recommendation, p: PoolPressure, now: float, demand: Demand | None = None
    ) -> _Gate:
        """Whether ``rec``, reversing the last switch inside the reversal cooldown, may go.

        Only where the phase that would get the worker back is observed saturated while the
        other is not. Within the forecast's horizon after the switch, under a load no heavier
        than it was checked at (``_within_forecast``), that refutes the switch's forecast,
        and the reversal goes as any switch (``OPEN``): a P->D switch left the one prefill
        worker of long chats saturated 56 s later (held-out 8B/H200 profile, 4 workers);
        waiting out the cooldown cost 8.5 pp more (-14.9 pp against static).

        Otherwise the load has changed since (a burst, a shift in the mix), and the reversal
        goes only if its forecast wins with its donor keeping up, never by trading one
        phase's overload for the other's (``SAFE``): outputs 2.17 times longer after a D->P
        switch left its two decode workers missing every request (stress draw 3, cell 4:
        -24.4 pp against static waiting out the cooldown, -11.0 reversing). A burst of long
        chats that reversed a D->P switch 212 s after it by trading overloads is held back
        (long-chat-bursty, Llama-3.1-8B/A100, 4 workers: 41.0 % reversing, 35.0 % waiting,
        the robustness suite's bar counting the reversal as flapping).

        Nothing reverses a switch taken on a shared overload inside the cooldown
        (``overload_shared``): a saturated donor is what its forecast accepted there."""
        if not self._reverses_within_cooldown(now, rec):
            return _Gate.OPEN
        if self._shared_overload:
            return _Gate.SHUT
        donor = Role.DECODE if rec is Recommendation.D_TO_P else Role.PREFILL
        if not donor_starved(donor.other, p, self.cfg):
            return _Gate.SHUT
        within = now < self._last_switch_end + self.cfg.horizon_s
        if within and self._within_forecast(demand, donor.other):
            return _Gate.OPEN
        # Without a demand (the paper's rule) there is no forecast to win.
        return _Gate.SAFE if demand is not None else _Gate.SHUT

    def _within_forecast(self, demand: Demand | None, phase: Role) -> bool:
        """Whether ``phase``'s load now, at the lower bound of its rate, is within what the
        last switch's forecast checked it at (the recent peak rate then); True when either
        demand is unknown (the paper's rule)."""
        then = self._switch_demand
        if demand is None or then is None:
            return True
        now, checked = demand.low, then.burst
        if phase is Role.PREFILL:
            return now.prefill_work <= checked.prefill_work
        return now.token_rate <= checked.token_rate

    def pick_candidate(
        self, workers: Sequence[WorkerSignals], source: Role
    ) -> WorkerSignals | None:
        """The cheapest-to-drain Active worker of ``source``, if the role can spare one."""
        pool = [w for w in workers if w.role is source and w.state is RoleState.ACTIVE]
        keep = self.cfg.min_prefill if source is Role.PREFILL else self.cfg.min_decode
        if len(pool) <= keep:
            return None
        return min(pool, key=lambda w: (w.drain_cost, w.worker))

    def switch_finished(self, worker: str, now: float) -> None:
        """The harness reports the committed switch is done; the cooldown starts now."""
        if self._switching == worker:
            self._switching = None
        self._cooldown_until = now + self.cfg.cooldown_s
        self._last_switch_end = now
        self._ends.append(now)
        self._windows.pop(worker, None)
        if self._check is not None and self._check.at == math.inf:
            c = self._check
            self._check = _Check(c.source, c.direction, now + self.cfg.settle_s, now)

    def switch_resumed(self, worker: str) -> None:
        """A harness that restarted mid-switch (its state came back from the cluster) tells the
        policy that ``worker`` is still switching, so that no second switch starts."""
        self._switching = worker
        self._streak = 0

    @property
    def switching(self) -> str | None:
        return self._switching
