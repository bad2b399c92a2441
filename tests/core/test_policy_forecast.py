"""The predictive switch rule: a switch only when its forecast gain beats its cost; a switch
whose forecast the observed pressure refutes is undone, restoring the prior split."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    FluidRolePolicy,
    PoolPressure,
    Recommendation,
    SwitchDecision,
    SwitchRule,
    WorkerSignals,
    donor_starved,
    prefill_saturated,
)
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.policy_forecast import (
    MAX_SCALE,
    PREFILL_QUANTILES,
    CapacityModel,
    Demand,
    DemandWindow,
    Forecast,
    Split,
    WorthBasis,
    clearly_worth,
    donor_keeps_up,
    overload_shared,
    overload_traded,
    poisson_tail,
    prefill_headroom,
    prefill_miss,
    prefill_scale,
    worth_basis,
)
from fluidpd.core.scheduler.worker import BusyWindow, Worker
from fluidpd.core.types import SLO, Request, Role, RoleState
from fluidpd.profiles import resolve_profile

SLO_ = SLO(2.0, 0.1)
MODEL = CapacityModel.from_profile(resolve_profile("llama-3.1-8b", "a100-80gb", None), SLO_)
CFG = FluidRoleConfig(n_persist=1, cooldown_s=0.0, settle_s=10.0, freeze_s=100.0)


def fleet(
    n_p: int,
    n_d: int,
    ppi: float,
    load: float,
    adm: float,
    busy: float | None = None,
    waiting: int = 0,
) -> list[WorkerSignals]:
    """Prefill workers at PPI ``ppi`` (busy ``busy`` of the time, where given) and decode
    workers at DPI_load ``load`` and DPI_adm ``adm`` (``waiting`` requests for KV each)."""
    return [
        WorkerSignals(f"p{i}", Role.PREFILL, RoleState.ACTIVE, queue_ppi=ppi, busy=busy)
        for i in range(n_p)
    ] + [
        WorkerSignals(
            f"d{i}", Role.DECODE, RoleState.ACTIVE, dpi_load=load, dpi_adm=adm, kv_waiting=waiting
        )
        for i in range(n_d)
    ]


def demand(rate: float, prompt: float, output: float) -> Demand:
    return Demand(rate, prompt, output, float(MODEL.prefill.time(prompt)), 1000, True)


def settled_forecast(
    d: Demand, split: Split, source: Role, observed: float, p: PoolPressure
) -> Forecast:
    """The forecast a settled policy makes from pool pressure ``p`` with the decode pool read
    at ``observed``."""
    return MODEL.forecast(
        d, split, source, CFG.horizon_s, True, observed, p.ppi_bar, p.prefill_busy,
        margin=CFG.gain_margin,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.1, 60.0),
    prompt=st.floats(50.0, 16000.0),
    output=st.floats(1.0, 2000.0),
    n_p=st.integers(1, 6),
    n_d=st.integers(2, 6),
)
def test_switch_taken_only_when_forecast_gain_beats_cost(
    rate: float, prompt: float, output: float, n_p: int, n_d: int
) -> None:
    # Signals that make eq. (22) recommend D->P; the forecast alone decides.
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(rate, prompt, output)
    decision = policy.observe(0.0, fleet(n_p, n_d, 3.0, 0.05, 0.05), d)
    # What the policy observed: decode DPI 0.05 (settled: a full window, no switch yet; the
    # pool average as the policy sums it) and PPI-bar 3.0.
    observed = sum([0.05] * n_d) / n_d
    f = MODEL.forecast(
        d, Split(n_p, n_d), Role.DECODE, CFG.horizon_s, True, observed, 3.0,
        margin=CFG.gain_margin, observed_streams=observed,
    )  # fmt: skip
    assert repr(policy.last_forecast) == repr(f)  # repr: nan == nan
    took = isinstance(decision, SwitchDecision)
    # PPI-bar 3.0 with no busy report is prefill saturation, decode at 0.05 is not: the
    # phase that would get the worker is starved.
    assert took == clearly_worth(f, CFG.gain_margin, receiver_starved=True)
    if took:
        assert isinstance(decision, SwitchDecision)
        assert decision.forecast is not None
        assert _gain_beats_cost(decision.forecast)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 60.0),
    prompt=st.floats(50.0, 16000.0),
    output=st.floats(1.0, 2000.0),
    samples=st.integers(10, 2000),
    n_p=st.integers(1, 6),
    n_d=st.integers(1, 6),
    source=st.sampled_from(list(Role)),
    observed=st.one_of(st.none(), st.floats(0.0, 3.0)),
    filling=st.one_of(st.none(), st.floats(0.0, 3.0)),
    ppi=st.floats(0.0, 5.0),
    busy=st.one_of(st.none(), st.floats(0.0, 1.0)),
    peak=st.floats(0.0, 3.0),
)
def test_a_switch_that_may_save_nothing_is_never_worth_taking(
    rate: float, prompt: float, output: float, samples: int, n_p: int, n_d: int,
    source: Role, observed: float | None, filling: float | None, ppi: float,
    busy: float | None, peak: float,
) -> None:  # fmt: skip
    """``may_save`` is the necessary condition the policy checks before a proposal's whole
    forecast: where it fails, no basis of ``worth_basis`` takes the forecast's switch."""
    d = replace(demand(rate, prompt, output), samples=samples, peak_rate=peak * rate)
    split = Split(n_p, n_d)
    args = (d, split, source, CFG.horizon_s)
    readings = (observed, ppi, busy, filling)
    f = MODEL.forecast(*args, True, *readings, margin=CFG.gain_margin, observed_streams=observed)
    if MODEL.may_save(*args, *readings):
        return
    for starved in (False, True):
        for final in (False, True):
            for share in (False, True):
                assert worth_basis(f, CFG.gain_margin, starved, final, share) is None


def _gain_beats_cost(f: Forecast) -> bool:
    """The forecast gain beats the cost at the rate's lower bound, or at the window's rate
    with nothing lost beyond the noise at the lower bound."""
    if f.gain > 0 and f.gain >= f.cost and f.loss_after < f.loss_before:
        return True
    mean = f.at_mean
    return (
        mean is not None
        and mean.gain > 0
        and mean.gain >= mean.cost
        and mean.loss_after < mean.loss_before
        and not f.loses_at_low
    )


def test_paper_rule_switches_without_a_forecast() -> None:
    policy = FluidRolePolicy(FluidRoleConfig(n_persist=1, switch_rule=SwitchRule.PAPER), MODEL)
    decision = policy.observe(0.0, fleet(4, 4, 3.0, 0.05, 0.05), demand(0.1, 500, 50))
    assert isinstance(decision, SwitchDecision) and decision.forecast is None


def test_comfortable_split_is_left_alone() -> None:
    # Eq. (22) fires (a PPI burst) but the forecast says 4P4D carries this demand.
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(1.0, 1000, 100)
    assert MODEL.bottleneck(d, Split(4, 4)) < 1
    assert not isinstance(policy.observe(0.0, fleet(4, 4, 3.0, 0.05, 0.05), d), SwitchDecision)
    assert policy.refused == 1


def _apply(split: dict[str, Role], decision: SwitchDecision) -> None:
    assert split[decision.worker] is decision.source
    split[decision.worker] = decision.target


def test_refuted_switch_is_undone_and_restores_the_split() -> None:
    policy = FluidRolePolicy(CFG, MODEL)
    # Prefill-bound at 2P4D (the forecast wants D->P), with outputs long enough that a
    # saturated decode pool, read as the model's error, makes the way back win.
    d = demand(10.0, 2000, 800)
    roles = {f"p{i}": Role.PREFILL for i in range(2)} | {f"d{i}": Role.DECODE for i in range(4)}
    before = dict(roles)
    first = policy.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d)
    assert isinstance(first, SwitchDecision) and first.source is Role.DECODE
    _apply(roles, first)
    policy.switch_finished(first.worker, 1.0)
    # Settled: the decode pool that gave up a worker is saturated, against the forecast.
    starved = [
        WorkerSignals(w, r, RoleState.ACTIVE, dpi_load=0.9, dpi_adm=0.99)
        if r is Role.DECODE
        else WorkerSignals(w, r, RoleState.ACTIVE, queue_ppi=0.2)
        for w, r in roles.items()
    ]
    assert not isinstance(policy.observe(5.0, starved, d), SwitchDecision)  # not settled yet
    undo = policy.observe(12.0, starved, d)
    assert isinstance(undo, SwitchDecision) and undo.undo
    assert undo.source is Role.PREFILL and undo.target is Role.DECODE
    _apply(roles, undo)
    assert sorted(roles.values()) == sorted(before.values())
    policy.switch_finished(undo.worker, 13.0)
    # The refuted direction stays frozen even though eq. (22) asks for it again.
    again = [
        WorkerSignals(w, r, RoleState.ACTIVE, queue_ppi=3.0)
        if r is Role.PREFILL
        else WorkerSignals(w, r, RoleState.ACTIVE, dpi_load=0.05, dpi_adm=0.05)
        for w, r in roles.items()
    ]
    assert not isinstance(policy.observe(50.0, again, d), SwitchDecision)
    assert policy.undone == 1


def test_an_undo_waits_for_the_switch_budget() -> None:
    # The same refuted switch with a budget of one switch per window: the undo would be the
    # window's second switch (flapping, by the budget), so it waits until the budget has
    # room and the donor is still starved, and it restores the split then.
    cfg = replace(CFG, switch_budget=1)
    policy = FluidRolePolicy(cfg, MODEL)
    d = demand(10.0, 2000, 800)
    first = policy.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d)
    assert isinstance(first, SwitchDecision) and first.source is Role.DECODE
    policy.switch_finished(first.worker, 1.0)
    starved = fleet(3, 3, 0.2, 0.9, 0.99, waiting=2)
    for t in (12.0, 100.0, 300.0, cfg.budget_window_s):
        assert not isinstance(policy.observe(t, starved, d), SwitchDecision)
    assert policy.undone == 0
    undo = None
    for t in range(int(cfg.budget_window_s) + 2, int(cfg.budget_window_s) + 40, 2):
        undo = policy.observe(float(t), starved, d)
        if isinstance(undo, SwitchDecision):
            break
    assert isinstance(undo, SwitchDecision) and undo.undo
    assert undo.source is Role.PREFILL and undo.target is Role.DECODE
    # Without the budget's limit the same switch is undone at its check.
    free = FluidRolePolicy(CFG, MODEL)
    again = free.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d)
    assert isinstance(again, SwitchDecision)
    free.switch_finished(again.worker, 1.0)
    assert isinstance(free.observe(12.0, starved, d), SwitchDecision) and free.undone == 1


def _switched_from_2p4d() -> tuple[FluidRolePolicy, Demand]:
    """A policy that has just moved 2P4D to 3P3D for 30 req/s of 2K-token prompts (prefill
    overloaded at 2P), and that demand."""
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(30.0, 2000, 50)
    first = policy.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d)
    assert isinstance(first, SwitchDecision) and first.source is Role.DECODE
    policy.switch_finished(first.worker, 1.0)
    return policy, d


def test_refuted_switch_whose_way_back_loses_is_frozen_not_undone() -> None:
    # Decode saturated after a D->P switch that took prefill out of overload (30 req/s of
    # 2K prompts at 2P): the forecast of moving the worker back overloads prefill again, so
    # the check at settle_s leaves the switch and only freezes its direction (no reversal
    # inside the cooldown), unless the starvation lasts (the next test).
    policy, d = _switched_from_2p4d()
    starved = fleet(3, 3, 0.2, 0.9, 0.99)
    assert not isinstance(policy.observe(12.0, starved, d), SwitchDecision)
    assert policy.undone == 0
    f = policy.last_forecast
    assert f is not None and not clearly_worth(f, CFG.gain_margin)
    assert not isinstance(policy.observe(50.0, fleet(3, 3, 3.0, 0.05, 0.05), d), SwitchDecision)


def test_a_donor_starved_for_settle_s_under_the_checked_load_undoes_the_switch() -> None:
    # The same switch, its donor fine when checked; later the decode pool saturates, with
    # requests waiting for its KV, while prefill idles, under the load the switch was checked
    # at. Starvation without a break for settle_s refutes the switch and undoes it, inside
    # the reversal cooldown, although the forecast of the way back (at the rate's lower
    # bound) does not win; a break restarts the count.
    policy, d = _switched_from_2p4d()
    fine, starved = fleet(3, 3, 0.2, 0.3, 0.3), fleet(3, 3, 0.2, 0.9, 0.99, waiting=2)
    assert not isinstance(policy.observe(12.0, fine, d), SwitchDecision)
    assert CFG.settle_s == 10.0
    for t in (100.0, 105.0, 110.0, 115.0, 119.0):
        assert not isinstance(policy.observe(t, fine if t == 105.0 else starved, d), SwitchDecision)
    assert policy.undone == 0
    undo = policy.observe(120.0, starved, d)
    assert isinstance(undo, SwitchDecision) and undo.undo and policy.undone == 1
    assert undo.source is Role.PREFILL and undo.target is Role.DECODE
    policy.switch_finished(undo.worker, 121.0)
    # Once undone, D->P is frozen for freeze_s, however hard eq. (22) asks.
    assert not isinstance(policy.observe(122.0, fleet(2, 4, 3.0, 0.05, 0.05), d), SwitchDecision)


def test_a_full_decode_pool_that_admits_all_waits_out_the_reversal_cooldown() -> None:
    # Saturated by DPI_adm but with nothing waiting for its KV: not the plain evidence an
    # undo inside the cooldown needs (it would count as flapping); after it, the undo goes.
    policy, d = _switched_from_2p4d()
    fine, full = fleet(3, 3, 0.2, 0.3, 0.3), fleet(3, 3, 0.2, 0.9, 0.99)
    assert not isinstance(policy.observe(12.0, fine, d), SwitchDecision)
    for t in (100.0, 200.0, 300.0):
        assert not isinstance(policy.observe(t, full, d), SwitchDecision)
    undo = policy.observe(310.0, full, d)
    assert isinstance(undo, SwitchDecision) and undo.undo


def test_a_donor_starved_under_a_heavier_load_waits_out_the_reversal_cooldown() -> None:
    # Starved only once the decode load is past what the switch was checked at (twice the
    # rate and outputs): what came after the switch, not the switch, is what the
    # observation shows, so the undo waits out the reversal cooldown (that would be flapping).
    policy, d = _switched_from_2p4d()
    heavier = demand(60.0, 2000, 100)
    fine, starved = fleet(3, 3, 0.2, 0.3, 0.3), fleet(3, 3, 0.2, 0.9, 0.99)
    assert not isinstance(policy.observe(12.0, fine, d), SwitchDecision)
    for t in (100.0, 200.0, 295.0, 305.0, 310.0):
        load = fine if t == 295.0 else starved
        assert not isinstance(policy.observe(t, load, heavier), SwitchDecision)
    assert CFG.reversal_cooldown_s == 300.0 and policy.undone == 0
    undo = policy.observe(335.0, starved, heavier)
    assert isinstance(undo, SwitchDecision) and undo.undo and policy.undone == 1


def test_the_reversal_cooldown_of_an_undo_counts_from_the_end_of_the_switch() -> None:
    # A switch that took 20 s to drain: its undo (under a load heavier than it was checked
    # at) waits 300 s from when it finished, as a reversal proposed by eq. (22) does and as
    # the robustness suite times reversals.
    policy = FluidRolePolicy(CFG, MODEL)
    d, heavier = demand(30.0, 2000, 50), demand(60.0, 2000, 100)
    first = policy.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d)
    assert isinstance(first, SwitchDecision)
    policy.switch_finished(first.worker, 20.0)
    fine, starved = fleet(3, 3, 0.2, 0.3, 0.3), fleet(3, 3, 0.2, 0.9, 0.99)
    assert not isinstance(policy.observe(31.0, fine, d), SwitchDecision)
    for t in (250.0, 300.0, 310.0, 319.0):
        assert not isinstance(policy.observe(t, starved, heavier), SwitchDecision)
    undo = policy.observe(320.0, starved, heavier)
    assert isinstance(undo, SwitchDecision) and undo.undo


def test_both_phases_saturated_later_does_not_undo() -> None:
    # Starvation is the donor saturated while the receiver is not: a later overload of both
    # (prefill workers busy throughout) is no evidence against the switch.
    policy, d = _switched_from_2p4d()
    assert not isinstance(policy.observe(12.0, fleet(3, 3, 0.2, 0.3, 0.3), d), SwitchDecision)
    both = fleet(3, 3, 3.0, 0.9, 0.99, busy=0.97)
    for t in range(100, 200, 5):
        assert not isinstance(policy.observe(float(t), both, d), SwitchDecision)
    assert policy.undone == 0


def test_requests_waiting_for_decode_kv_read_past_a_full_pool() -> None:
    # DPI_adm stops at 1; the KV the requests waiting for it would commit is added, so the
    # calibration sees how far past capacity a pool is whose KV is taken. (Eq. 22 proposes
    # D->P, so the policy forecasts it with the calibration it read.) The prefill workers are
    # busy half of the time: the prompts are late behind decode admission, not the prefill
    # pool's backlog.
    policy = FluidRolePolicy(CFG, MODEL)
    d = replace(demand(10.0, 2000, 800), seen_s=60.0)
    policy.observe(0.0, fleet(2, 4, 3.0, 0.2, 0.3, busy=0.5, waiting=6), d)
    waiting = MODEL.waiting_kv(d, 6)
    assert waiting == pytest.approx(
        6 * (2000 + min(800, MODEL.reserve_output_clip)) / MODEL.kv_capacity
    )

    def forecast(observed: float) -> Forecast:
        return MODEL.forecast(
            d, Split(2, 4), Role.DECODE, CFG.horizon_s, True, observed, 3.0, 0.5,
            margin=CFG.gain_margin, observed_streams=0.2,
        )  # fmt: skip

    assert repr(policy.last_forecast) == repr(forecast(0.3 + waiting))
    assert forecast(0.3 + waiting).donor_after > forecast(0.3).donor_after


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.5, 40.0),
    n_decode=st.integers(1, 8),
    waiting=st.floats(0.1, 40.0),
)
def test_a_kv_queue_counts_by_the_share_of_the_slack_its_wait_takes(
    rate: float, n_decode: int, waiting: float
) -> None:
    # Little's law: requests queued for one worker's KV wait W = waiting / (rate / n_decode).
    # Their KV counts by W's share of the TTFT slack, whole once W passes it, and never more.
    d = demand(rate, 2000, 400)
    slack = MODEL.slo.ttft - d.prefill_s
    share = min(1.0, waiting / (rate / n_decode) / slack)
    added = MODEL.waiting_pressure(d, waiting, n_decode)
    assert added == pytest.approx(share * MODEL.waiting_kv(d, waiting))
    assert added <= MODEL.waiting_kv(d, waiting)
    # The longer the same queue waits (fewer arrivals to drain it), the more it counts.
    assert MODEL.waiting_pressure(demand(rate / 2, 2000, 400), waiting, n_decode) >= added


def test_a_brief_kv_queue_does_not_read_a_pool_past_full() -> None:
    # Two requests that wait 0.2 s of the slack for a lone decode worker's KV cost no
    # deadlines: its reading stays near DPI_adm (0.96) rather than past 1, so the forecast
    # of a P->D switch is calibrated as by a pool at its edge, not past it. A queue of 40
    # waits past the slack and counts in full.
    d = replace(demand(10.0, 2000, 400), seen_s=60.0)
    brief = MODEL.waiting_pressure(d, 2, 1)
    assert MODEL.slo.ttft - d.prefill_s > 2 / 10.0
    assert brief < 0.5 * MODEL.waiting_kv(d, 2)
    assert MODEL.waiting_pressure(d, 40, 1) == MODEL.waiting_kv(d, 40)
    for waiting, observed in ((2, 0.96 + brief), (40, 0.96 + MODEL.waiting_kv(d, 40))):
        policy = FluidRolePolicy(replace(CFG, enabled=False), MODEL)
        policy.observe(0.0, fleet(3, 1, 0.3, 0.5, 0.96, busy=0.4, waiting=waiting), d)
        p = policy.last_pressure
        assert p is not None
        got = policy._forecast(policy._readings(0.0, p, d, Role.DECODE))
        assert repr(got) == repr(settled_forecast(d, Split(3, 1), Role.DECODE, observed, p))


def test_late_prompts_behind_decode_admission_are_not_prefill_saturation() -> None:
    # After a P->D switch relieved a saturated decode pool, prompts that waited for decode
    # KV are far past their deadlines (PPI-bar in the hundreds) while the prefill workers
    # idle: that is no evidence that prefill lacks the worker it gave.
    cfg = FluidRoleConfig()
    late = PoolPressure(440.0, 0.66, 0.71, 4, 2, prefill_busy=0.19)
    assert not prefill_saturated(late, cfg)
    assert not donor_starved(Role.PREFILL, late, cfg)
    busy = PoolPressure(440.0, 0.66, 0.71, 4, 2, prefill_busy=0.95)
    assert prefill_saturated(busy, cfg) and donor_starved(Role.PREFILL, busy, cfg)
    # Workers that do not report a busy fraction are judged by PPI-bar alone.
    assert prefill_saturated(PoolPressure(440.0, 0.66, 0.71, 4, 2), cfg)


def test_a_wall_clock_stepped_back_drops_the_readings_stamped_after_it() -> None:
    """The decode pool's history stays in time order (its spells are read from the newest
    end): after the live controller's wall clock steps back, readings stamped later than the
    new time are gone, and the history restarts from the new reading."""
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(4.0, 2000, 200)
    for t in range(100, 106):
        policy.observe(float(t), fleet(2, 2, 0.3, 0.9, 0.9), d)
    assert policy._spell(policy._streams_seen, 105.0, 60.0) == pytest.approx(0.9)
    policy.observe(50.0, fleet(2, 2, 0.3, 0.1, 0.1), d)
    assert [t for t, _ in policy._streams_seen] == [50.0]
    assert policy._spell(policy._streams_seen, 50.0, 60.0) == pytest.approx(0.1)


def test_a_lull_does_not_calibrate_the_decode_model_down() -> None:
    # The decode pool ran at 0.4 for the whole window, then one interval found it idle (a
    # gap between clustered arrivals): the calibration reads the window's mean, not the 0.
    # (Eq. 22 proposes D->P throughout; the forecast declines it, so each interval records
    # the forecast with the calibration it used.)
    policy = FluidRolePolicy(CFG, MODEL)
    d = replace(demand(2.0, 2000, 1000), seen_s=60.0)
    for t in range(60):
        policy.observe(float(t), fleet(2, 4, 3.0, 0.4, 0.4), d)
    assert policy.refused == 60

    def forecast(observed: float) -> Forecast:
        return MODEL.forecast(
            d, Split(2, 4), Role.DECODE, CFG.horizon_s, True, observed, 3.0, margin=CFG.gain_margin
        )

    policy.observe(60.0, fleet(2, 4, 3.0, 0.0, 0.0), d)
    assert repr(policy.last_forecast) == repr(forecast(60 * 0.4 / 61))
    assert forecast(0.0).donor_after < forecast(0.4).donor_after
    # A spell busier than the window's mean is taken as it is.
    policy.observe(61.0, fleet(2, 4, 3.0, 0.5, 0.5), d)
    assert repr(policy.last_forecast) == repr(forecast(0.5))


@pytest.mark.parametrize(("spell_s", "switches"), [(1, False), (5, False), (15, True)])
def test_a_decode_spike_alone_does_not_take_a_worker_from_prefill(
    spell_s: int, switches: bool
) -> None:
    # A lone decode worker at 0.3 for a minute, then full (DPI_adm 0.97, 3 requests waiting
    # for KV) for the last ``spell_s`` intervals. As the receiver of a P->D switch it is read
    # over eq. (20)'s window: a burst of a few intervals is no evidence for the switch, a
    # spell that fills the window is (before, one interval of it took the switch).
    policy = FluidRolePolicy(replace(CFG, n_persist=3), MODEL)
    d = replace(demand(2.0, 2000, 1000), seen_s=60.0)
    switched = False
    for t in range(60):
        full = t >= 60 - spell_s
        signals = fleet(3, 1, 0.3, 0.3, 0.97 if full else 0.3, busy=0.4, waiting=3 if full else 0)
        decision = policy.observe(float(t), signals, d)
        if isinstance(decision, SwitchDecision):
            assert decision.source is Role.PREFILL
            switched = True
            break
    assert switched is switches


def test_the_way_back_of_a_d_to_p_switch_reads_the_decode_pool_as_it_is() -> None:
    # A decode pool at 0.3 for half a minute, then full with requests waiting for its KV in
    # the latest interval. As the receiver of a first P->D switch it is read over eq. (20)'s
    # window; where the last switch took a worker from it (D->P), a P->D switch goes back to
    # the split before, and the pool is read at its latest interval.
    readings = [0.3] * 30 + [0.97]

    def way_back(policy: FluidRolePolicy, d: Demand, n_p: int, n_d: int, t0: float) -> Forecast:
        quiet = replace(policy.cfg, enabled=False)
        policy.cfg = quiet
        for i, adm in enumerate(readings):
            waiting = 3 if adm > 0.5 else 0
            signals = fleet(n_p, n_d, 0.2, 0.3, adm, busy=0.4, waiting=waiting)
            policy.observe(t0 + i, signals, d)
        p = policy.last_pressure
        assert p is not None
        return policy._forecast(policy._readings(t0 + len(readings) - 1, p, d, Role.PREFILL))

    switched, _ = _switched_from_2p4d()
    # Long generations after the switch (the model puts 3 decode workers at 0.26), so the
    # decode pool's reading moves the forecast within the calibration's bounds.
    d = replace(demand(6.0, 2000, 1000), seen_s=60.0)
    latest = way_back(switched, d, 3, 3, 20.0)
    fresh_policy = FluidRolePolicy(CFG, MODEL)
    fresh = way_back(fresh_policy, d, 3, 3, 20.0)
    p = switched.last_pressure
    assert p is not None

    def forecast(observed: float) -> Forecast:
        return settled_forecast(d, Split(3, 3), Role.PREFILL, observed, p)

    now = 20.0 + len(readings) - 1
    seen = list(fresh_policy._decode_seen)
    assert seen == list(switched._decode_seen)
    window = [v for t, v in seen if t >= now - CFG.window_s]
    assert seen[-1][1] > 2 * sum(window) / len(window)
    assert repr(latest) == repr(forecast(seen[-1][1]))
    assert repr(fresh) == repr(forecast(sum(window) / len(window)))
    assert latest.before > fresh.before


def test_a_filling_decode_pool_is_read_from_when_it_has_filled() -> None:
    # The first half-minute of a trace: two decode workers fill from empty over 24 s, then
    # hold. As a P->D receiver the pool is read over eq. (20)'s window, but not before it
    # could have filled (``fill_seconds`` after the first arrival): the readings of its
    # filling would hold back a switch that its level asks for. As a D->P donor it is read
    # at its latest interval.
    cfg = replace(CFG, enabled=False)
    policy = FluidRolePolicy(cfg, MODEL)
    base = demand(25.0, 500, 500)
    readings = [min(0.8, 0.8 * t / 24) for t in range(29)] + [0.7]
    for t, adm in enumerate(readings):
        d = replace(base, full_window=False, seen_s=t + 0.5, samples=int(25 * (t + 0.5)))
        policy.observe(float(t), fleet(4, 2, 0.3, 0.8 * adm, adm, busy=0.4), d)
    now = len(readings) - 1.0
    start = now - d.seen_s + MODEL.fill_seconds(d, 2)
    assert now - cfg.window_s < start < now - 1.0
    kept = [v for t, v in enumerate(readings) if t >= start]
    window = [v for t, v in enumerate(readings) if t >= now - cfg.window_s]
    p = policy.last_pressure
    assert p is not None

    def forecast(source: Role, observed: float) -> Forecast:
        return settled_forecast(d, Split(4, 2), source, observed, p)

    receiver = policy._forecast(policy._readings(now, p, d, Role.PREFILL))
    assert repr(receiver) == repr(forecast(Role.PREFILL, sum(kept) / len(kept)))
    assert receiver.before > forecast(Role.PREFILL, sum(window) / len(window)).before
    donor = policy._forecast(policy._readings(now, p, d, Role.DECODE))
    assert repr(donor) == repr(forecast(Role.DECODE, readings[-1]))
    assert repr(donor) != repr(forecast(Role.DECODE, sum(kept) / len(kept)))


def test_clustered_arrivals_count_as_fewer_samples() -> None:
    regular, poisson, clustered = (DemandWindow(MODEL.prefill) for _ in range(3))
    rng = __import__("random").Random(1)
    t = 0.0
    for i in range(600):
        regular.add(i * 0.1, 1000, 100)
        t += rng.expovariate(10.0)
        poisson.add(t, 1000, 100)
        # Bursts of ten at once, one burst a second: the same mean rate.
        clustered.add(float(i // 10), 1000, 100)
    assert regular.arrival_cv2() < 0.01
    assert 0.8 < poisson.arrival_cv2() < 1.2
    assert clustered.arrival_cv2() > 8.0
    # 61 arrivals suffice for a Poisson stream but not for one this clustered.
    d = Demand(6.1, 1000, 100, 0.1, 61, False)
    assert d.reliable
    assert not Demand(6.1, 1000, 100, 0.1, 61, False, arrival_cv2=9.0).reliable
    assert Demand(6.1, 1000, 100, 0.1, 180, False, arrival_cv2=9.0).reliable


@pytest.mark.parametrize("drain_s", [1.0, 10.0])
def test_switch_budget_limits_switches_per_window(drain_s: float) -> None:
    # The budget counts a switch from its start and from its end (flapping is counted by when
    # switches end): one that drained 10 s holds the budget until 600 s after its end.
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0, switch_budget=1)
    policy = FluidRolePolicy(cfg, None)
    first = policy.observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05))
    assert isinstance(first, SwitchDecision)
    policy.switch_finished(first.worker, drain_s)
    soon = policy.observe(drain_s + 1.0, fleet(3, 3, 3.0, 0.05, 0.05))
    assert not isinstance(soon, SwitchDecision)
    early = policy.observe(cfg.budget_window_s + drain_s - 0.5, fleet(3, 3, 3.0, 0.05, 0.05))
    assert not isinstance(early, SwitchDecision)
    later = policy.observe(cfg.budget_window_s + drain_s + 1.0, fleet(3, 3, 3.0, 0.05, 0.05))
    assert isinstance(later, SwitchDecision)


def test_headroom_is_relative_to_prompt_and_slo() -> None:
    assert prefill_headroom(0.1, 2.0) > prefill_headroom(0.7, 2.0) > prefill_headroom(0.7, 1.0)
    assert prefill_headroom(2.5, 2.0) == 0.0
    assert math.isinf(MODEL.prefill_ratio(demand(1.0, 60000, 10), 4))


def _long_prompts(rate: float, median: int, n: int = 200) -> Demand:
    """A window of prompts lognormal around ``median`` tokens (sigma 0.5), 900-token outputs."""
    w = DemandWindow(MODEL.prefill, window_s=n / rate)
    rng = random.Random(0)
    for i in range(n):
        w.add(i / rate, int(rng.lognormvariate(math.log(median), 0.5)), 900)
    return w.demand((n - 0.5) / rate)


def test_the_ttft_headroom_is_that_of_the_prompts_that_can_make_it() -> None:
    d = _long_prompts(2.0, 18000)
    q = d.prefill_quantiles
    assert d.prefill_s > SLO_.ttft and min(q) < SLO_.ttft < max(q)
    fit = [t for t in q if t < SLO_.ttft]
    assert math.isclose(d.attainable_prefill_s(SLO_.ttft), sum(fit) / len(fit))
    # Read over every prompt the mean's budget is gone and no pool size is within capacity;
    # the prompts that can make TTFT have time left to queue, so enough workers are.
    assert math.isinf(MODEL.prefill_ratio(replace(d, prefill_quantiles=()), 7))
    assert MODEL.prefill_ratio(d, 12) < 1.0 < MODEL.prefill_ratio(d, 4)
    # Where every prompt fits, the mean's budget stands; where none does, nothing is within.
    short = _long_prompts(2.0, 4000)
    assert short.attainable_prefill_s(SLO_.ttft) == short.prefill_s
    assert MODEL.prefill_ratio(short, 2) == MODEL.prefill_ratio(
        replace(short, prefill_quantiles=()), 2
    )
    assert math.isinf(MODEL.prefill_ratio(_long_prompts(2.0, 200000), 7))


def test_a_prefill_pool_past_its_ttft_capacity_gives_a_worker_while_it_keeps_up() -> None:
    # 18K-token prompts under a 2 s TTFT: six prefill workers are past the headroom the
    # prompts that can make it leave (ratio > 1 at the peak), busy well under 1; the two decode
    # workers are saturated. P->D loses no deadline the prefill pool would keep.
    d = _long_prompts(2.0, 18000)
    f = MODEL.forecast(d, Split(6, 2), Role.PREFILL, 120.0, True, 0.98, 0.5, 0.2)
    assert f.donor_after >= 1.0 and f.donor_before >= 1.0 and f.donor_busy_after < 1.0
    assert donor_keeps_up(f) and clearly_worth(f, CFG.gain_margin)
    # A prefill pool within capacity before the switch keeps the plain donor check ...
    assert not donor_keeps_up(replace(f, donor_before=0.99))
    # ... one short of throughput after it is refused ...
    assert not clearly_worth(replace(f, donor_busy_after=1.0), CFG.gain_margin)
    # ... and a decode donor's ratio is its throughput already.
    g = MODEL.forecast(d, Split(2, 6), Role.DECODE, 120.0, True, 0.5, 3.0, 0.9)
    assert g.donor_before == 0.0 and math.isinf(g.donor_busy_after)
    assert donor_keeps_up(g) == (g.donor_after < 1.0)


def test_a_filling_decode_pool_read_above_the_model_holds_back_its_donor() -> None:
    d = demand(12.0, 2000, 200)
    split = Split(3, 3)
    plain = MODEL.forecast(d, split, Role.DECODE, 120.0, True, None, 0.5)
    modelled = MODEL.decode_ratio(d, 3, MODEL.prefill_wait(d, 3))
    # A pool still filling reads a lower bound of its load: above the model, the donor check
    # of a D->P switch holds the decode workers left to it ...
    high = MODEL.forecast(d, split, Role.DECODE, 120.0, True, None, 0.5, None, 1.5 * modelled)
    assert math.isclose(high.donor_after, 1.5 * plain.donor_after, rel_tol=1e-9)
    # ... below the model it says nothing (the calibrated reading of a settled pool may) ...
    low = MODEL.forecast(d, split, Role.DECODE, 120.0, True, None, 0.5, None, 0.5 * modelled)
    assert repr(low) == repr(plain)
    settled = MODEL.forecast(d, split, Role.DECODE, 120.0, True, 0.5 * modelled, 0.5)
    assert settled.donor_after < plain.donor_after
    # ... and it never makes a P->D switch look more needed.
    p_plain = MODEL.forecast(d, split, Role.PREFILL, 120.0, True, None, 0.5)
    p_high = MODEL.forecast(d, split, Role.PREFILL, 120.0, True, None, 0.5, None, 3 * modelled)
    assert repr(p_high) == repr(p_plain)


def test_the_policy_reads_an_unsettled_decode_pool_as_a_lower_bound() -> None:
    # Half a window seen, shorter than the pool takes to fill: not settled.
    d = replace(demand(4.0, 2000, 800), full_window=False, seen_s=1.0)
    assert d.seen_s < MODEL.fill_seconds(d, 3)
    policy = FluidRolePolicy(CFG, MODEL)
    policy.observe(0.0, fleet(3, 3, 3.0, 0.3, 0.3), d)
    f = MODEL.forecast(
        d, Split(3, 3), Role.DECODE, CFG.horizon_s, True, None, 3.0, None, 0.3, CFG.gain_margin,
        observed_streams=0.3,
    )  # fmt: skip
    assert repr(policy.last_forecast) == repr(f)
    model_only = MODEL.forecast(d, Split(3, 3), Role.DECODE, CFG.horizon_s, True, None, 3.0)
    assert f.donor_after > model_only.donor_after


def test_a_pool_of_two_kinds_of_streams_fills_when_the_long_ones_have_run() -> None:
    # 70 % of the outputs about 30 tokens, 30 % about 800: twice the mean ends before the long
    # streams do. E[O^2] / E[O], the mean stream a token belongs to, does not.
    mean = 0.7 * 30 + 0.3 * 800
    second = 0.7 * 30**2 + 0.3 * 800**2
    d = Demand(20.0, 1500, mean, float(MODEL.prefill.time(1500)), 1000, False, output2=second)
    plain = replace(d, output2=0.0)
    ratio = (MODEL.fill_seconds(d, 2) - d.prefill_s) / (MODEL.fill_seconds(plain, 2) - d.prefill_s)
    assert math.isclose(ratio, second / mean / (2 * mean))
    assert second / mean > 700
    # Exponential-like lengths (E[O^2] = 2 E[O]^2) keep twice the mean.
    expo = replace(d, output2=2 * mean**2)
    assert math.isclose(MODEL.fill_seconds(expo, 2), MODEL.fill_seconds(plain, 2))


def test_demand_window_keeps_running_sums() -> None:
    w = DemandWindow(MODEL.prefill, window_s=10.0)
    for i in range(200):
        w.add(i * 0.1, 1000 + i, 10)
    d = w.demand(19.95)
    assert d.samples == 100 and math.isclose(d.rate, 10.0)
    assert math.isclose(d.prompt, sum(1000 + i for i in range(100, 200)) / 100)
    assert d.full_window and d.reliable


def test_prompts_whose_prefill_outlasts_ttft_miss_at_any_split() -> None:
    w = DemandWindow(MODEL.prefill, window_s=100.0)
    long_ = next(n for n in range(1000, 200000, 500) if MODEL.prefill.time(n) > 1.5 * SLO_.ttft)
    for i in range(400):
        w.add(i * 0.2, 300 if i % 2 else long_, 100)
    d = w.demand(80.0)
    q = d.prefill_quantiles
    assert len(q) == PREFILL_QUANTILES and list(q) == sorted(q)
    assert q[0] == MODEL.prefill.time(300) and q[-1] == MODEL.prefill.time(long_)
    # Half the prompts cannot make TTFT however idle the prefill pool is ...
    assert 0.5 <= MODEL.queue_miss(d, 0.01) < 0.55
    # ... so more prefill saves only the other half's misses, which the mean prefill time's
    # budget (every prompt alike) overstates.
    mean_only = replace(d, prefill_quantiles=())
    assert MODEL.queue_miss(mean_only, 0.01) < 0.5
    saved = MODEL.queue_miss(d, 0.8) - MODEL.queue_miss(d, 0.4)
    assert 0 < saved < MODEL.queue_miss(mean_only, 0.8) - MODEL.queue_miss(mean_only, 0.4)


def test_no_steal_budget_while_requests_wait_for_decode_kv() -> None:
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    w = Worker.create("d0", Role.DECODE, profile, SLO_, FluidTokenConfig())
    assert w.decode.steal_budget(1) > 0
    big = profile.kv.capacity_tokens // 2
    for rid in range(3):  # the third does not fit and waits in the prealloc queue
        w.decode.add(Request(rid, 0.0, big - 10, 5))
    assert w.decode.prealloc
    assert w.decode.steal_budget(1) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.1, 60.0),
    peak=st.floats(0.0, 120.0),
    prompt=st.floats(50.0, 16000.0),
    output=st.floats(1.0, 2000.0),
    samples=st.integers(20, 2000),
    n_p=st.integers(1, 6),
    n_d=st.integers(2, 6),
)
def test_a_taken_switch_leaves_its_donor_within_capacity_at_the_peak(
    rate: float, peak: float, prompt: float, output: float, samples: int, n_p: int, n_d: int
) -> None:
    d = Demand(rate, prompt, output, float(MODEL.prefill.time(prompt)), samples, True, peak)
    policy = FluidRolePolicy(CFG, MODEL)
    decision = policy.observe(0.0, fleet(n_p, n_d, 3.0, 0.05, 0.05), d)
    if not isinstance(decision, SwitchDecision):
        return
    # The decode pool that is left carries the busiest rate the demand may bring (the recent
    # peak or the rate's upper bound), with the calibration the policy applied.
    f = decision.forecast
    assert f is not None
    # (A decode donor is never taken on a shared overload: ``overload_shared``.)
    assert donor_keeps_up(f) or overload_traded(f, CFG.gain_margin)
    assert d.burst.rate >= max(peak, rate)
    # A higher peak can only hold a switch back, never bring one on.
    calmer = Demand(rate, prompt, output, d.prefill_s, samples, True, 0.0)
    again = FluidRolePolicy(CFG, MODEL).observe(0.0, fleet(n_p, n_d, 3.0, 0.05, 0.05), calmer)
    assert isinstance(again, SwitchDecision)


def test_a_switch_that_would_overload_its_donor_at_the_peak_is_refused() -> None:
    d = demand(30.0, 2000, 50)  # prefill-bound: the forecast wants D->P from 2P4D
    fleet_ = fleet(2, 4, 3.0, 0.05, 0.05)
    assert isinstance(FluidRolePolicy(CFG, MODEL).observe(0.0, fleet_, d), SwitchDecision)
    # The same demand after a burst three decode workers could not carry.
    ratio = MODEL.decode_ratio(d, 3)
    burst = Demand(d.rate, d.prompt, d.output, d.prefill_s, d.samples, True, 30.0 * 1.2 / ratio)
    policy = FluidRolePolicy(CFG, MODEL)
    assert not isinstance(policy.observe(0.0, fleet_, burst), SwitchDecision)
    assert policy.refused == 1 and policy.last_forecast is not None
    assert policy.last_forecast.donor_after >= 1.0


def test_a_donor_near_capacity_at_the_peak_needs_the_receivers_own_reading() -> None:
    # A P->D switch of long generations whose decode pool the model alone forecasts (not yet
    # settled): taken with its prefill donor well within capacity at the peak ...
    d = demand(6.0, 2000, 1500)
    f = MODEL.forecast(
        d, Split(5, 3), Role.PREFILL, CFG.horizon_s, True, None, 0.3, margin=CFG.gain_margin
    )
    assert not f.receiver_observed and f.donor_after < 0.5
    assert worth_basis(f, CFG.gain_margin) is WorthBasis.KEEPS_UP
    # ... refused with it inside the gain margin of capacity there (16 workers: 8P8D -> 7P9D
    # with the seven prefill workers at 0.98 of the peak, static 97.4 %, FluidPD 87.1 %) ...
    near = replace(f, donor_after=0.97)
    assert donor_keeps_up(near) and not donor_keeps_up(near, CFG.gain_margin)
    assert worth_basis(near, CFG.gain_margin) is None
    # ... and taken once the decode pool's own reading backs the forecast.
    observed = replace(near, receiver_observed=True)
    assert worth_basis(observed, CFG.gain_margin) is WorthBasis.KEEPS_UP
    # Past capacity at the peak, no reading makes it keep up.
    assert worth_basis(replace(observed, donor_after=1.01), CFG.gain_margin) is None


def test_few_arrivals_widen_the_rate_bounds() -> None:
    few, many = (Demand(10.0, 1000, 100, 0.1, n, True) for n in (25, 2500))
    assert few.low.rate < many.low.rate < 10.0 < many.burst.rate < few.burst.rate
    assert math.isclose(few.low.rate, 10.0 * (1 - 2 / 5))
    assert not Demand(10.0, 1000, 100, 0.1, 19, True).reliable


def test_both_phases_saturated_is_no_reason_to_undo() -> None:
    # Decode KV is reserved at dispatch: a prefill queue far past its deadlines fills DPI_adm
    # while the decode batch idles. That does not refute the D->P switch.
    policy, d = _switched_from_2p4d()
    both = fleet(3, 3, 50.0, 0.05, 0.99)
    assert not isinstance(policy.observe(12.0, both, d), SwitchDecision)
    assert policy.undone == 0


def test_peak_rate_sees_bursts_beyond_poisson_noise() -> None:
    steady = DemandWindow(MODEL.prefill)
    rng = __import__("random").Random(0)
    t = 0.0
    while t < 300.0:
        t += rng.expovariate(5.0)
        steady.add(t, 1000, 100)
    d = steady.demand(300.0)
    # A steady 5 req/s stream: the peak bin less one standard error stays near the mean.
    assert 4.0 < d.peak_rate < 6.0
    bursty = DemandWindow(MODEL.prefill)
    for i in range(600):  # 20 req/s for 30 s, then 1 req/s
        bursty.add(i / 20.0, 1000, 100)
    for i in range(60):
        bursty.add(30.0 + i, 1000, 100)
    d = bursty.demand(90.0)
    assert d.rate < 12.0 and d.peak_rate > 15.0
    # Bins older than the hold period are forgotten.
    assert bursty.demand(90.0 + bursty.hold_s).peak_rate < 2.0


def test_a_burst_that_began_inside_the_current_bin_is_read_as_it_builds() -> None:
    # 2 req/s for 200 s, then 25 req/s from 200 s: at 221 s the last completed bin (180-210 s)
    # holds 10 s of the burst and the window's mean is about 10 req/s; the arrivals of the
    # last 10 s are the burst's.
    w = DemandWindow(MODEL.prefill)
    times = [i / 2.0 for i in range(400)] + [200.0 + i / 25.0 for i in range(525)]
    for t in times:
        w.add(t, 1000, 100)
    d = w.demand(221.0)
    assert d.rate < 11.0 and d.peak_rate < 10.0
    assert d.building_rate > 20.0
    assert d.burst.rate < 12.0 and d.rising.burst.rate > 20.0
    # Before a third of a bin has passed since the first arrival, nothing is building.
    fresh = DemandWindow(MODEL.prefill)
    for i in range(40):
        fresh.add(i / 8.0, 1000, 100)
    assert fresh.demand(5.0).building_rate == 0.0
    # A steady stream's trailing thirds read near its rate, not past it.
    steady = DemandWindow(MODEL.prefill)
    for i in range(600):
        steady.add(i / 5.0, 1000, 100)
    assert steady.demand(120.0).building_rate <= 5.0


def test_a_decode_donor_is_checked_at_the_burst_as_it_builds_a_prefill_donor_is_not() -> None:
    # 4P4D at 6 req/s of 2K-token prompts with 300-token outputs, a burst building at 30.
    calm = Demand(6.0, 2000, 300, float(MODEL.prefill.time(2000)), 1000, True, peak_rate=6.0)
    building = replace(calm, building_rate=30.0)
    split = Split(4, 4)
    for source in (Role.DECODE, Role.PREFILL):
        a, b = (
            MODEL.forecast(x, split, source, CFG.horizon_s, True, 0.3, 0.5, 0.5, margin=0.1)
            for x in (calm, building)
        )
        if source is Role.DECODE:
            assert b.donor_after > a.donor_after and b.peak_arrivals > a.peak_arrivals
        else:
            assert repr(a) == repr(b)


def test_uncalibrated_donor_of_a_switch_that_leaves_prefill_overloaded_must_hold_any_scale() -> (
    None
):
    # 6 req/s of 8.5K-token prompts on 2P2D: P3 is still over its TTFT headroom, so
    # FluidToken would push the excess onto the one decode worker left.
    d = demand(6.0, 8500, 100)
    split = Split(2, 2)
    assert MODEL.prefill_ratio(d.burst, 3) >= 1.0
    donor = MODEL.decode_ratio(d.burst, 1, MODEL.prefill_wait(d.burst, 3))
    assert donor < 1.0 <= MAX_SCALE * donor
    calibrated = MODEL.forecast(d, split, Role.DECODE, CFG.horizon_s, True, 0.1, 3.0)
    unsettled = MODEL.forecast(d, split, Role.DECODE, CFG.horizon_s, True, None, 3.0)
    assert calibrated.donor_after < 1.0 <= unsettled.donor_after
    assert clearly_worth(calibrated, CFG.gain_margin) != clearly_worth(unsettled, CFG.gain_margin)
    # A switch that brings prefill within capacity keeps the plain model's donor.
    light = demand(3.0, 8500, 100)
    assert MODEL.prefill_ratio(light.burst, 3) < 1.0
    f = MODEL.forecast(light, split, Role.DECODE, CFG.horizon_s, True, None, 0.9)
    queued = MODEL.prefill_wait(light.burst, 3)
    assert math.isclose(f.donor_after, MODEL.decode_ratio(light.burst, 1, queued))


def test_headroom_shrinks_with_the_spread_of_prefill_times() -> None:
    # Without spread (E[T^2] = E[T]^2) the M/G/1 headroom is the M/D/1 one.
    assert math.isclose(prefill_headroom(0.5, 2.0, 0.5), prefill_headroom(0.5, 2.0))
    assert math.isclose(prefill_headroom(0.5, 2.0), 2 * 1.5 / (2 * 2.0 - 0.5))
    assert prefill_headroom(0.5, 2.0, 1.0) < prefill_headroom(0.5, 2.0, 0.6)
    spread = Demand(2.0, 8000, 300, 0.5, 500, True, prefill_s2=0.5)
    plain = Demand(2.0, 8000, 300, 0.5, 500, True)
    assert MODEL.prefill_ratio(spread, 2) > MODEL.prefill_ratio(plain, 2)


@given(busy=st.floats(0.0, 0.999), budget=st.floats(0.01, 5.0), residual=st.floats(0.01, 5.0))
def test_prefill_miss_grows_smoothly_with_the_load(
    busy: float, budget: float, residual: float
) -> None:
    m = prefill_miss(busy, budget, residual)
    assert 0.0 <= m <= busy
    assert prefill_miss(min(0.9999, busy + 0.05), budget, residual) >= m
    assert prefill_miss(busy, budget * 2, residual) <= m
    assert prefill_miss(1.0, budget, residual) == 1.0
    # At the headroom the mean wait is the budget, and a share rho e^-rho of prompts misses.
    rho = 2 * budget / (2 * budget + residual)
    assert math.isclose(prefill_miss(rho, budget, residual), rho * math.exp(-rho))


def test_poisson_tail_is_a_probability() -> None:
    assert poisson_tail(0.0, 10) == 0.0
    assert poisson_tail(100.0, 50) > 0.99 and poisson_tail(50.0, 100) < 1e-6
    assert 0.4 < poisson_tail(100.0, 100) < 0.6


def test_a_decode_pool_behind_a_saturated_prefill_queue_reads_its_streams() -> None:
    # KV is reserved at dispatch: behind a prefill pool far past its deadlines and busy, the
    # prompts queued for prefill fill DPI_adm and requests wait for KV the backlog holds. The
    # pool then reads as its streams (DPI_load) plus the KV the model's requests hold while
    # they wait out the TTFT budget and prefill, never above DPI_adm; with the prefill workers
    # busy half of the time, the same pool reads DPI_adm plus its waiting requests' KV.
    d = replace(demand(4.0, 4000, 400), seen_s=60.0)
    commit = 4000 + min(400, MODEL.reserve_output_clip)
    budget = SLO_.ttft - d.attainable_prefill_s(SLO_.ttft)
    reserved = MODEL.reserved_kv(d, 4)
    assert reserved == pytest.approx(4.0 / 4 * (budget + d.prefill_s) * commit / MODEL.kv_capacity)
    assert 0.2 + reserved < 0.9

    def reading(busy: float) -> float:
        policy = FluidRolePolicy(replace(CFG, enabled=False), MODEL)
        policy.observe(0.0, fleet(4, 4, 3.0, 0.2, 0.9, busy=busy, waiting=6), d)
        return policy._decode_seen[-1][1]

    assert reading(0.97) == pytest.approx(0.2 + reserved)
    assert reading(0.5) == pytest.approx(0.9 + MODEL.waiting_pressure(d, 6, 4))
    # A pool whose own streams fill it reads them, whatever holds the prefill pool.
    policy = FluidRolePolicy(replace(CFG, enabled=False), MODEL)
    policy.observe(0.0, fleet(4, 4, 3.0, 0.85, 0.9, busy=0.97, waiting=6), d)
    assert policy._decode_seen[-1][1] == pytest.approx(min(0.9, 0.85 + reserved))


TINY = CapacityModel.from_profile(resolve_profile("llama-3.2-1b", "h200", None), SLO(3.0, 0.15))


def test_a_decode_donor_must_carry_its_own_streams() -> None:
    # One prefill worker at its capacity by the model (busy 1.01) puts the queue at the whole
    # TTFT budget and the KV it reserves past the three decode workers' capacity (1.7 of it),
    # where DPI_adm reads 0.69: calibrated by that reading alone, the two decode workers a D->P
    # switch leaves (whose queue the second prefill worker clears) read 0.52 at the peak. Their
    # streams alone, as DPI_load reads them (0.5 against the model's 0.53 for three), are past
    # capacity there; so is the donor (stress draw 24, cell 8).
    d = Demand(29.6, 4732, 453, 0.034, 1000, True, seen_s=60.0)
    split = Split(1, 3)
    assert TINY.prefill_busy(d, 1) > 1.0
    assert TINY.decode_ratio(d, 3, TINY.prefill_wait(d, 1)) > 1.5

    def forecast(streams: float | None) -> Forecast:
        return TINY.forecast(
            d, split, Role.DECODE, CFG.horizon_s, True, 0.69, 0.35, 0.96,
            margin=CFG.gain_margin, observed_streams=streams,
        )  # fmt: skip

    assert forecast(None).donor_after < 1.0
    assert forecast(0.5).donor_after > 1.0
    assert not clearly_worth(forecast(0.5), CFG.gain_margin)
    # The policy reads the streams and checks its decode donors on them.
    policy = FluidRolePolicy(CFG, TINY)
    signals = fleet(1, 3, 0.35, 0.5, 0.69, busy=0.96)
    assert not isinstance(policy.observe(0.0, signals, d), SwitchDecision)
    f = policy._forecast(policy._readings(0.0, policy.last_pressure, d, Role.DECODE))
    assert repr(f) == repr(forecast(0.5))


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.5, 40.0),
    prompt=st.floats(100.0, 12000.0),
    output=st.floats(1.0, 1500.0),
    n_p=st.integers(1, 6),
    n_d=st.integers(2, 6),
    observed=st.floats(0.0, 1.5),
    streams=st.floats(0.0, 1.5),
)
def test_the_streams_check_only_raises_a_decode_donor(
    rate: float, prompt: float, output: float, n_p: int, n_d: int, observed: float, streams: float
) -> None:
    # The streams' reading never makes a decode donor look lighter, and a prefill donor's
    # forecast does not read it.
    d = demand(rate, prompt, output)
    split = Split(n_p, n_d)

    def forecast(source: Role, s: float | None) -> Forecast:
        return MODEL.forecast(
            d, split, source, CFG.horizon_s, True, observed, 0.5, 0.5, observed_streams=s
        )

    assert forecast(Role.DECODE, streams).donor_after >= forecast(Role.DECODE, None).donor_after
    assert repr(forecast(Role.PREFILL, streams)) == repr(forecast(Role.PREFILL, None))


def test_requests_waiting_for_prefill_hold_decode_kv() -> None:
    d = demand(2.0, 8000, 300)
    assert MODEL.decode_ratio(d, 2, 5.0) > MODEL.decode_ratio(d, 2)
    # The wait grows with the prefill load, and is the TTFT budget at most.
    assert MODEL.prefill_wait(d, 3) < MODEL.prefill_wait(d, 2) <= SLO_.ttft - d.prefill_s
    assert MODEL.prefill_wait(d, 1) == SLO_.ttft - d.prefill_s


def test_widely_spread_work_widens_the_rate_bounds() -> None:
    even = Demand(10.0, 1000, 100, 0.1, 100, True, output2=100.0**2)
    spread = Demand(10.0, 1000, 100, 0.1, 100, True, output2=4 * 100.0**2)
    assert spread.spread == 4.0 and even.spread == 1.0
    assert math.isclose(spread.rate_error, 2 * even.rate_error)


def test_a_saving_inside_the_noise_of_the_misses_is_refused() -> None:
    base = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 10.0)
    # 12 loss-seconds over a 120 s horizon: 0.1 of 10 arrivals = 1 request saved, against a
    # standard deviation of sqrt(0.2 * 10) = 1.4 requests missed anyway.
    assert base.saved < base.noise and not clearly_worth(base, 0.1)
    clear = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    assert clear.saved > clear.noise and clearly_worth(clear, 0.1)


def test_clustered_arrivals_widen_the_noise_a_saving_must_pass() -> None:
    # The same 100 requests saved of 1,000, against misses that come in clusters: with
    # arrival gaps of c_a^2 60 the count of misses varies 60 times Poisson's, sqrt(0.2 x
    # 1000 x 60) = 110 requests, and the saving is no evidence. Gaps smoother than Poisson's
    # narrow nothing.
    clear = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    bursty = replace(clear, arrival_cv2=60.0)
    assert math.isclose(bursty.noise, math.sqrt(0.2 * 1000 * 60))
    assert bursty.saved < bursty.noise and not clearly_worth(bursty, 0.1)
    assert replace(clear, arrival_cv2=0.5).noise == clear.noise
    assert clearly_worth(replace(clear, arrival_cv2=20.0), 0.1)  # 63 requests of noise


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.1, 8.0),
    prompt=st.floats(2000.0, 16000.0),
    output=st.floats(10.0, 1500.0),
    ppi=st.floats(0.0, 0.6),
    n_p=st.integers(1, 4),
    n_d=st.integers(1, 4),
)
def test_the_forecast_proposes_only_switches_that_clearly_win(
    rate: float, prompt: float, output: float, ppi: float, n_p: int, n_d: int
) -> None:
    # Pressure that eqs. (22)-(23) see nothing in: any switch comes from the forecast itself,
    # and then only one that clearly wins (and keeps its donor within capacity).
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(rate, prompt, output)
    decision = policy.observe(0.0, fleet(n_p, n_d, ppi, 0.05, 0.05), d)
    if isinstance(decision, SwitchDecision):
        f = decision.forecast
        assert f is not None and clearly_worth(f, CFG.gain_margin)
        assert f.donor_after < 1.0 and _gain_beats_cost(f)
    else:
        split = Split(n_p, n_d)
        for source, pool in ((Role.DECODE, n_d), (Role.PREFILL, n_p)):
            if pool > 1:
                f = MODEL.forecast(
                    d, split, source, CFG.horizon_s, True, 0.05, ppi, margin=CFG.gain_margin
                )
                assert not clearly_worth(f, CFG.gain_margin)


def test_a_within_capacity_split_that_misses_deadlines_is_rebalanced() -> None:
    # 2.2 req/s of 8K prompts on 2P2D: prefill is within its headroom (PPI-bar 0.5, eq. 22
    # proposes nothing) but the spread of its queue misses a share of TTFTs; one decode worker
    # carries the streams.
    d = Demand(2.2, 8000, 300, float(MODEL.prefill.time(8000)), 2000, True)
    assert MODEL.prefill_ratio(d, 2) < 1.0
    policy = FluidRolePolicy(CFG, MODEL)
    decision = policy.observe(0.0, fleet(2, 2, 0.5, 0.1, 0.1), d)
    assert isinstance(decision, SwitchDecision) and decision.source is Role.DECODE


def test_prefill_calibration_reads_what_the_pool_does_not_how_late_it_is() -> None:
    """PPI-bar in the thousands (deadlines passed: a slow host, a stall upstream) on prefill
    workers busy as much as the model says is no prefill overload: the forecast's load ratio
    is the model's. Workers measured busier than the model (the demand or the engine's speed
    is off) raise it by the measured factor; without a busy report PPI-bar stands in."""
    d = demand(4.0, 6000.0, 340.0)
    split = Split(4, 4)
    modelled_busy = MODEL.prefill_busy(d, 4)
    modelled = MODEL.prefill_ratio(d, 4)
    assert prefill_scale(modelled, 1862.0, modelled_busy, modelled_busy) == 1.0
    assert prefill_scale(modelled, 1862.0, 0.5 * modelled_busy, modelled_busy) == 1.0
    assert prefill_scale(modelled, 1862.0, 1.0, modelled_busy) == pytest.approx(1.0 / modelled_busy)
    assert prefill_scale(modelled, 0.9, 1.0, modelled_busy) == 1.0  # deadlines met
    assert prefill_scale(modelled, 1862.0) == min(MAX_SCALE, 2.0 / modelled)  # no busy report
    late = MODEL.forecast(d, split, Role.DECODE, 120.0, True, 0.35, 1862.0, modelled_busy)
    quiet = MODEL.forecast(d, split, Role.DECODE, 120.0, True, 0.35, 0.5, modelled_busy)
    assert late.before == quiet.before and late.loss_before == quiet.loss_before
    busy = MODEL.forecast(d, split, Role.DECODE, 120.0, True, 0.35, 1862.0, 1.0)
    assert busy.loss_before > late.loss_before


def test_busy_window_measures_the_time_in_steps() -> None:
    w = BusyWindow(window_s=10.0)
    assert w.busy(5.0) == 0.0
    for end in (2.0, 4.0, 6.0, 8.0, 10.0):
        w.add(end, 1.0)
    assert w.busy(10.0) == pytest.approx(0.5)
    # Since the role began at t=6 only the last two steps and 4 s count.
    assert w.busy(10.0, since=6.0) == pytest.approx(0.5)
    assert w.busy(10.0, since=8.5) == pytest.approx(1.0 / 1.5)
    # A step that began before the window counts only for its part inside it.
    assert w.busy(15.5) == pytest.approx((0.5 + 1.0 + 1.0) / 10.0)
    assert w.busy(40.0) == 0.0


def test_a_prefill_worker_reports_its_measured_busy_fraction() -> None:
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    worker = Worker.create("p0", Role.PREFILL, profile, SLO_, FluidTokenConfig(), now=0.0)
    assert worker.pressure(10.0).busy == 0.0
    decode = Worker.create("d0", Role.DECODE, profile, SLO_, FluidTokenConfig(), now=0.0)
    assert decode.pressure(10.0).busy is None and decode.pressure(10.0).signals().busy is None


def _traded() -> Forecast:
    """A switch away from a split past capacity even at the rate's lower bound (decode KV full
    after a shift to longer outputs) to one within capacity at the window's rate, whose donor
    only the recent peak takes past capacity (6 %)."""
    return Forecast(
        before=1.2,
        after=0.9,
        during=1.2,
        drain_s=1.0,
        gain=100.0,
        cost=1.0,
        donor_after=1.06,
        loss_before=1.2,
        loss_after=0.1,
        loss_during=1.2,
        arrivals=1800.0,
        at_rate_after=0.95,
        burst_before=1.3,
        burst_after=1.06,
        donor_observed=True,
        donor_at_rate=0.95,
    )


def test_a_failing_split_is_traded_only_on_the_observation_of_its_starved_phase() -> None:
    f = _traded()
    assert overload_traded(f, CFG.gain_margin)
    assert clearly_worth(f, CFG.gain_margin, receiver_starved=True)
    # On the model's word alone the donor check stands.
    assert not clearly_worth(f, CFG.gain_margin)
    # A donor forecast that no observation of its own backs (a decode pool not yet filled).
    assert not clearly_worth(replace(f, donor_observed=False), CFG.gain_margin, True)
    # A split kept that is within capacity at the lower bound of the rate.
    assert not overload_traded(replace(f, before=0.99), CFG.gain_margin)
    # A donor past capacity at the window's own rate after the switch: both phases fail, and
    # trading one overload for the other only flips between them.
    assert not overload_traded(replace(f, at_rate_after=1.0, donor_at_rate=1.0), CFG.gain_margin)
    # The receiver still past capacity at the window's rate, the donor clearly within it: the
    # switch relieves the phase that fails and flips nothing ...
    assert overload_traded(replace(f, at_rate_after=1.4, donor_at_rate=0.6), CFG.gain_margin)
    # ... but a donor within capacity there by less than the margin may flip it.
    assert not overload_traded(replace(f, at_rate_after=1.4, donor_at_rate=0.95), CFG.gain_margin)
    # A donor not forecast at the window's rate is not taken to keep up there.
    assert not overload_traded(
        replace(f, at_rate_after=1.4, donor_at_rate=math.inf), CFG.gain_margin
    )
    # The peak's worst phase must fall by the margin.
    assert not overload_traded(replace(f, burst_after=1.25), CFG.gain_margin)


def test_the_switch_policy_trades_only_for_a_starved_receiver() -> None:
    d = demand(30.0, 2000, 50)
    f = _traded()
    starved = PoolPressure(3.0, 0.05, 0.05, 2, 4)
    assert donor_starved(Role.PREFILL, starved, CFG)

    class Fixed(FluidRolePolicy):
        """Forecasts ``f`` for whatever it reads (and lets it be asked for)."""

        def _may_save(self, r: object) -> bool:
            return True

        def _forecast(self, r: object) -> Forecast:
            return f

    assert isinstance(
        Fixed(CFG, MODEL).observe(0.0, fleet(2, 4, 3.0, 0.05, 0.05), d), SwitchDecision
    )
    # The same forecast with the prefill queue within its deadlines: refused.
    calm = Fixed(CFG, MODEL)
    assert not isinstance(calm.observe(0.0, fleet(2, 4, 0.5, 0.05, 0.05), d), SwitchDecision)


def test_a_refused_forecast_is_asked_again_while_the_recommendation_persists() -> None:
    # Eq. (22) asks for D->P every interval; the forecast refuses on a comfortable demand at
    # the third (n_persist) and wins on the next. The switch comes then, not n_persist
    # intervals later: where the refusals fell does not decide whether a switch is taken.
    policy = FluidRolePolicy(replace(CFG, n_persist=3), MODEL)
    calm, busy = demand(1.0, 1000, 100), demand(30.0, 2000, 50)
    for t in range(3):
        assert not isinstance(
            policy.observe(float(t), fleet(2, 4, 3.0, 0.05, 0.05), calm), SwitchDecision
        )
    assert policy.refused == 1
    decision = policy.observe(3.0, fleet(2, 4, 3.0, 0.05, 0.05), busy)
    assert isinstance(decision, SwitchDecision) and decision.source is Role.DECODE


def test_a_switch_that_loses_at_the_peak_rate_is_refused() -> None:
    # Gains at the rate's lower bound, donor within capacity at the peak ...
    gains = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    assert clearly_worth(replace(gains, peak_loss_before=0.3, peak_loss_after=0.2), 0.1)
    # ... but the split it leaves misses more than the one kept at the peak: refused.
    loses = replace(gains, peak_loss_before=0.3, peak_loss_after=0.35)
    assert not clearly_worth(loses, 0.1)


def test_the_forecast_counts_the_loss_at_the_peak_rate() -> None:
    d = Demand(3.0, 8000, 400, float(MODEL.prefill.time(8000)), 500, True, 4.5)
    f = MODEL.forecast(d, Split(5, 3), Role.DECODE, 120.0, True)
    assert d.burst.rate == 4.5
    assert f.peak_loss_before == MODEL.loss(d.burst, Split(5, 3))
    assert f.peak_loss_after == MODEL.loss(d.burst, Split(6, 2))


def test_the_forecast_reads_the_donor_at_the_window_rate() -> None:
    # A peak above the window's rate: the donor's ratio there is the donor check's, at the
    # window's rate it is what ``overload_traded`` asks to stay within capacity.
    d = Demand(3.0, 8000, 400, float(MODEL.prefill.time(8000)), 500, True, 4.5)
    f = MODEL.forecast(d, Split(5, 3), Role.DECODE, 120.0, True)
    queued = MODEL.prefill_wait(d, 6)
    assert f.donor_at_rate == MODEL.decode_ratio(d, 2, queued)
    assert f.donor_at_rate < f.donor_after
    g = MODEL.forecast(d, Split(5, 3), Role.PREFILL, 120.0, True)
    assert g.donor_at_rate == MODEL.prefill_ratio(d, 4) < g.donor_after


def test_prompts_dealt_in_turn_wait_less_than_one_queue_of_the_whole_stream() -> None:
    t = float(MODEL.prefill.time(9000))
    d = Demand(2.0, 9000, 300, t, 500, True, prefill_s2=1.2 * t * t, arrival_cv2=1.0)
    # One worker sees the whole Poisson stream: Kingman's residual is Pollaczek-Khinchine's.
    assert math.isclose(d.queue_residual(1), d.prefill_residual)
    # Each of n workers fed in turn sees arrivals n times as regular ...
    assert d.queue_residual(5) < d.queue_residual(2) < d.queue_residual(1)
    assert math.isclose(d.queue_residual(4), t * (0.25 + 0.2))
    # ... clustered arrivals less so ...
    assert replace(d, arrival_cv2=4.0).queue_residual(4) > d.queue_residual(4)
    # ... so at the same busy fraction a pool of five misses fewer deadlines than one worker,
    # unless the model is told to take each worker's arrivals as the whole stream's.
    whole = replace(MODEL, split_arrivals=False)
    assert MODEL.queue_miss(d, 0.8, 5) < MODEL.queue_miss(d, 0.8, 1)
    assert whole.queue_miss(d, 0.8, 5) == whole.queue_miss(d, 0.8, 1) == MODEL.queue_miss(d, 0.8)
    assert MODEL.prefill_ratio(d, 5) < whole.prefill_ratio(d, 5)


@settings(max_examples=80, deadline=None)
@given(
    rate=st.floats(0.5, 200.0),
    prompt=st.floats(50.0, 16000.0),
    output=st.floats(1.0, 2000.0),
)
def test_the_decode_ratio_is_finite_and_falls_with_each_decode_worker(
    rate: float, prompt: float, output: float
) -> None:
    # Past its throughput a pool's ratio is the tokens asked over the tokens it delivers:
    # finite wherever the requests not yet decoding leave it some KV, so that splits that
    # are all past capacity keep their order.
    d = demand(rate, prompt, output)
    loads = [MODEL.decode_load(d, n) for n in range(1, 9)]
    ratios = [MODEL.decode_ratio(d, n) for n in range(1, 9)]
    kv_left = [load.reserved < load.slots for load in loads]
    for left, r in zip(kv_left, ratios, strict=True):
        assert math.isfinite(r) or not left
    pairs = zip(ratios, ratios[1:], kv_left, kv_left[1:], strict=False)
    assert all(a >= b for a, b, left_a, left_b in pairs if left_a and left_b)


@settings(max_examples=80, deadline=None)
@given(
    rate=st.floats(0.5, 200.0),
    prompt=st.floats(50.0, 16000.0),
    output=st.floats(1.0, 2000.0),
    n_d=st.integers(1, 8),
    queued=st.floats(0.0, 2.0),
)
def test_the_decode_ratio_passes_1_where_streams_outgrow_the_batch_or_the_kv(
    rate: float, prompt: float, output: float, n_d: int, queued: float
) -> None:
    # Within capacity the ratio is the concurrency and KV terms of eq. (13)'s load; the
    # throughput ratio takes over exactly where they pass 1 (unless reservations alone fill
    # the KV, where no batch is left to measure a throughput by).
    d = demand(rate, prompt, output)
    load = MODEL.decode_load(d, n_d, queued)
    within = load.concurrency <= load.n_tpot and load.held <= load.slots
    ratio = MODEL.decode_ratio(d, n_d, queued)
    assert (ratio <= 1.0 + 1e-9) == within or math.isclose(ratio, 1.0, rel_tol=1e-6)
    if not within and math.isfinite(load.throughput_ratio):
        assert ratio == load.throughput_ratio
    else:
        # Within capacity, or the requests not yet decoding hold all of the KV.
        assert ratio == load.demand_ratio


def test_a_decode_pool_past_its_throughput_gains_from_another_worker() -> None:
    # 40 req/s of 1,000-token outputs: two and three decode workers are both past the rate
    # at which eq. (13)'s streams grow without bound. Read as infinite, 6P2D and 5P3D lost
    # the same (2.0) and P->D had no gain; the throughput ratio orders them.
    d = demand(40.0, 200, 1000)
    assert math.isinf(MODEL.decode_load(d, 3).concurrency)
    assert MODEL.decode_ratio(d, 2) > MODEL.decode_ratio(d, 3) > 1.0
    f = MODEL.forecast(d, Split(6, 2), Role.PREFILL, 120.0, True)
    assert f.loss_after < f.loss_before < 2.0
    assert clearly_worth(f, 0.1)


def test_a_gain_at_the_windows_rate_counts_where_the_lower_bound_loses_nothing() -> None:
    # Long generations on 2P2D, their decode KV near full: at the rate's lower bound (few
    # arrivals, widely spread outputs) neither split misses, at the window's rate the kept
    # one misses 4 % of 100 arrivals and the other none.
    f = Forecast(0.5, 0.3, 0.5, 1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 60.0, horizon_s=120.0)
    f = replace(f, mean_loss_before=0.04, mean_loss_during=0.04, mean_arrivals=100.0)
    f = replace(f, receiver_observed=True, donor_observed=True)
    assert f.gain == 0.0 and not f.loses_at_low
    mean = f.at_mean
    assert mean is not None and math.isclose(mean.gain, 4.8) and math.isclose(mean.cost, 0.04)
    assert clearly_worth(f, 0.1) and math.isclose(f.net, 4.76)
    # Where the switch loses at the lower bound beyond the noise of its misses (3 requests
    # against none), or the saving at the window's rate is inside its noise, it is refused.
    worse = replace(f, loss_after=0.05)
    assert worse.loses_at_low and not clearly_worth(worse, 0.1)
    assert not clearly_worth(replace(f, mean_arrivals=10.0), 0.1)
    # Nor where the lower bound sees the split kept miss a request (it tells the splits
    # apart, and shows no clear gain), or either phase has not been observed (its forecast
    # is the model's alone).
    seen = replace(f, loss_before=1.5 / 60.0, loss_after=1.5 / 60.0)
    assert not seen.loses_at_low and not clearly_worth(seen, 0.1)
    assert not clearly_worth(replace(f, receiver_observed=False), 0.1)
    assert not clearly_worth(replace(f, donor_observed=False), 0.1)
    # Nor for the budget's last switch, which no undo could follow.
    assert not clearly_worth(f, 0.1, final=True) and clearly_worth(f, 0.1, final=False)
    # Without a forecast at the window's rate only the lower bound counts.
    alone = replace(f, mean_arrivals=0.0)
    assert alone.at_mean is None and not clearly_worth(alone, 0.1) and alone.net == 0.0


def test_a_loss_at_the_peak_inside_its_noise_is_no_reason_to_refuse() -> None:
    gains = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    # Both splits past capacity at the peak, 0.001 apart over 230 arrivals: a fifth of a
    # request against a standard deviation of 21 missed anyway.
    near = replace(gains, peak_loss_before=1.864, peak_loss_after=1.865, peak_arrivals=230.0)
    assert not near.loses_at_peak and clearly_worth(near, 0.1)
    # 0.05 of 1,000 arrivals is 50 requests against a standard deviation of 17: refused.
    far = replace(gains, peak_loss_before=0.3, peak_loss_after=0.35, peak_arrivals=1000.0)
    assert far.loses_at_peak and not clearly_worth(far, 0.1)
    # Without the peak's arrivals any loss there refuses.
    assert replace(near, peak_arrivals=0.0).loses_at_peak


def test_a_forecast_that_wins_is_taken_where_both_phases_read_pressured() -> None:
    # PPI-bar past the deadlines and the decode pool full: eqs. (22)-(23) read both phases
    # as pressured (needs capacity), but the prefill workers are busy 30 % of the time: the
    # prompts wait for decode KV. The forecast's P->D wins, and is taken.
    policy = FluidRolePolicy(CFG, MODEL)
    d = demand(40.0, 200, 1000)
    pressured = fleet(6, 2, 3.0, 0.9, 0.99, busy=0.3)
    decision = policy.observe(0.0, pressured, d)
    assert isinstance(decision, SwitchDecision)
    assert (decision.source, decision.target) == (Role.PREFILL, Role.DECODE)
    # The paper's rule has no forecast: it only reports that capacity is needed.
    paper = FluidRolePolicy(replace(CFG, switch_rule=SwitchRule.PAPER), MODEL)
    assert paper.observe(0.0, pressured, d) is Recommendation.NEEDS_CAPACITY


def test_a_reversal_inside_the_cooldown_refutes_a_forecast_or_keeps_its_donor_up() -> None:
    # A P->D switch for 5 req/s of 4K-token prompts; 4 s after it the three prefill workers
    # are saturated while decode idles. Under the same demand that refutes the switch's
    # forecast, and the reversal goes through inside the reversal cooldown.
    d = demand(5.0, 4000, 600)

    def switched(cfg: FluidRoleConfig) -> FluidRolePolicy:
        policy = FluidRolePolicy(cfg, MODEL)
        first = policy.observe(0.0, fleet(4, 2, 0.1, 0.9, 0.99), d)
        assert isinstance(first, SwitchDecision) and first.source is Role.PREFILL
        policy.switch_finished(first.worker, 1.0)
        return policy

    back = switched(CFG).observe(5.0, fleet(3, 3, 3.0, 0.2, 0.2, busy=0.97), d)
    assert isinstance(back, SwitchDecision) and back.source is Role.DECODE
    # At 6 req/s even the rate's lower bound (5.6) is past the peak the switch was checked
    # at (5.3): the load has changed, and the reversal goes only because its forecast wins
    # with the decode pool it takes a worker from keeping up.
    heavier = demand(6.0, 4000, 600)
    assert heavier.low.rate > d.burst.rate
    later = switched(CFG).observe(5.0, fleet(3, 3, 3.0, 0.2, 0.2, busy=0.97), heavier)
    assert isinstance(later, SwitchDecision) and later.forecast is not None
    assert donor_keeps_up(later.forecast) and clearly_worth(later.forecast, CFG.gain_margin)
    # Prefill workers behind their deadlines but busy 89 % of the time are not saturated:
    # nothing goes through inside the cooldown, though without it the forecast takes the
    # reversal.
    behind = fleet(3, 3, 3.0, 0.2, 0.2, busy=0.89)
    assert switched(CFG).observe(5.0, behind, d) is Recommendation.NONE
    no_cooldown = replace(CFG, reversal_cooldown_s=0.0)
    assert isinstance(switched(no_cooldown).observe(5.0, behind, d), SwitchDecision)


def test_the_last_switch_of_the_budget_must_keep_its_donors_misses_small() -> None:
    # A switch the budget can still undo is checked by its donor's mean load; the last one
    # it allows in the window must also add at most the margin to what the donor itself
    # misses at the peak.
    gains = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    tail = replace(gains, donor_tail=0.2)
    assert clearly_worth(tail, 0.1) and not clearly_worth(tail, 0.1, final=True)
    assert clearly_worth(replace(gains, donor_tail=0.05), 0.1, final=True)


def test_no_switch_may_lose_past_the_rates_bound() -> None:
    # A switch that gains at the lower bound and keeps its donor up at the peak, but that
    # would lose most requests at the bound raised by the margin, where the split kept
    # loses 5 %: refused, whether or not the budget could still undo it.
    gains = Forecast(0.5, 0.4, 0.5, 1.0, 12.0, 0.0, 0.5, 0.2, 0.1, 0.2, 1000.0)
    risky = replace(gains, beyond_loss_before=0.05, beyond_loss_after=0.6, beyond_arrivals=600)
    assert risky.loses_beyond and not gains.loses_beyond
    assert not clearly_worth(risky, 0.1) and not clearly_worth(risky, 0.1, final=True)
    assert clearly_worth(gains, 0.1) and clearly_worth(gains, 0.1, final=True)
    # Within the noise of the misses there (sqrt(0.05 x 600) = 5.5 requests), no loss.
    noise = replace(risky, beyond_loss_after=0.05 + 5.0 / 600)
    assert not noise.loses_beyond and clearly_worth(noise, 0.1)
    # Where the split kept fails at that rate itself, the check does not apply.
    failing = replace(risky, beyond_loss_before=1.2, beyond_loss_after=1.4)
    assert not failing.loses_beyond and clearly_worth(failing, 0.1)


def test_the_rate_past_the_bound_is_the_bound_raised_by_the_margin_or_the_peak() -> None:
    d = Demand(4.0, 8000, 400, float(MODEL.prefill.time(8000)), 250, True, 3.9)
    bound = d.rate * (1.0 + d.rate_error)
    assert d.beyond(0.1).rate == pytest.approx(bound * 1.1)
    assert d.beyond(0.0).rate == pytest.approx(d.burst.rate)
    # A recent peak above it is what the switch must carry.
    assert replace(d, peak_rate=6.0).beyond(0.1).rate == 6.0
    f = MODEL.forecast(d, Split(5, 3), Role.DECODE, 120.0, True, margin=0.1)
    high = d.beyond(0.1)
    assert f.beyond_loss_before == pytest.approx(MODEL.loss(high, Split(5, 3)))
    assert f.beyond_loss_after == pytest.approx(MODEL.loss(high, Split(6, 2)))
    assert f.beyond_arrivals == pytest.approx(high.rate * 120.0)
    # Near the decode KV knee the raised rate asks more of the donor than the bound does.
    assert f.beyond_loss_after > f.peak_loss_after


def test_the_forecast_reads_the_donors_added_misses_at_the_peak() -> None:
    d = Demand(3.0, 8000, 400, float(MODEL.prefill.time(8000)), 500, True, 4.5)
    f = MODEL.forecast(d, Split(5, 3), Role.DECODE, 120.0, True)
    # One decode worker fewer at the peak: its streams and KV pass a worker's share more often.
    kept = MODEL.decode_miss(d.burst, 3, 1.0, MODEL.prefill_wait(d.burst, 5))
    left = MODEL.decode_miss(d.burst, 2, 1.0, MODEL.prefill_wait(d.burst, 6))
    assert f.donor_tail == pytest.approx(left - kept) and f.donor_tail > 0
    # Only a decode donor is held to it (``FluidRolePolicy._final_away``).
    assert MODEL.forecast(d, Split(5, 3), Role.PREFILL, 120.0, True).donor_tail == 0.0


def test_the_last_switch_in_the_budget_window_is_held_to_its_donors_misses() -> None:
    # The same D->P switch twice (2K-token prompts, 1K-token outputs at 8 req/s, 4P4D, the
    # decode pool reading what the model says): with a switch already started in the window
    # it is the budget's last, and a donor left at 0.92 of its KV at the peak, missing a
    # seventh more there, refuses it; with the budget fresh it goes on its mean load.
    d = Demand(8.0, 2000, 1000, float(MODEL.prefill.time(2000)), 500, True, 9.6)
    ratio = MODEL.decode_ratio(d, 4, MODEL.prefill_wait(d, 4))
    asking = fleet(4, 4, 3.0, ratio, ratio)
    fresh, spent = FluidRolePolicy(CFG, MODEL), FluidRolePolicy(CFG, MODEL)
    spent._starts.append(-10.0)
    assert isinstance(fresh.observe(0.0, asking, d), SwitchDecision)
    f = fresh.last_forecast
    assert f is not None and f.donor_after < 1.0 and f.donor_tail > CFG.gain_margin
    assert not isinstance(spent.observe(0.0, asking, d), SwitchDecision)
    assert spent.refused == 1
    # Once the first start has left the window, the budget is fresh again.
    assert isinstance(spent.observe(600.0, asking, d), SwitchDecision)


def test_a_reversal_with_the_last_of_the_budget_is_checked_by_its_mean() -> None:
    # The budget's last switch is held to its donor's added misses only when it moves the
    # split further away: a reversal returns to the split the last switch left.
    d = Demand(8.0, 2000, 1000, float(MODEL.prefill.time(2000)), 500, True, 9.6)
    ratio = MODEL.decode_ratio(d, 4, MODEL.prefill_wait(d, 4))
    asking = fleet(4, 4, 3.0, ratio, ratio)
    further, back = FluidRolePolicy(CFG, MODEL), FluidRolePolicy(CFG, MODEL)
    for policy, last in ((further, Recommendation.D_TO_P), (back, Recommendation.P_TO_D)):
        policy._starts.append(-10.0)
        policy._last_direction = last
    assert not isinstance(further.observe(0.0, asking, d), SwitchDecision)
    decision = back.observe(0.0, asking, d)
    assert isinstance(decision, SwitchDecision) and decision.source is Role.DECODE


def test_the_last_switch_of_the_budget_is_held_to_its_donors_misses_only_for_decode() -> None:
    # A prefill pool past its headroom queues, which its wait tail counts; only a decode
    # donor, which stops admitting at its KV edge, is held to its added misses at the peak.
    policy = FluidRolePolicy(CFG, MODEL)
    policy._starts.append(-10.0)
    assert policy._final_away(0.0, Role.DECODE)
    assert not policy._final_away(0.0, Role.PREFILL)
    # Not the budget's last, or reversing the last switch: no extra check.
    assert not FluidRolePolicy(CFG, MODEL)._final_away(0.0, Role.DECODE)
    policy._last_direction = Recommendation.P_TO_D
    assert not policy._final_away(0.0, Role.DECODE)


def test_a_receiver_is_observed_where_its_own_pressure_calibrates_the_forecast() -> None:
    d, split = demand(2.0, 8000, 300), Split(2, 2)
    # P->D: the decode pool's settled reading; D->P: the prefill workers' busy fraction.
    assert MODEL.forecast(d, split, Role.PREFILL, 120.0, True, 0.8).receiver_observed
    assert not MODEL.forecast(d, split, Role.PREFILL, 120.0, True).receiver_observed
    assert MODEL.forecast(d, split, Role.DECODE, 120.0, True, None, 0.5, 0.4).receiver_observed
    assert not MODEL.forecast(d, split, Role.DECODE, 120.0, True, 0.8, 0.5).receiver_observed


def test_a_wall_clock_stepped_back_is_survived() -> None:
    # The live controller's clock is the wall clock: an observation dated before the last
    # switch's end (NTP stepped it back) must not break the decode history.
    policy = FluidRolePolicy(CFG, MODEL)
    policy.switch_finished("p0", 100.0)
    result = policy.observe(50.0, fleet(2, 2, 0.1, 0.1, 0.1), demand(1.0, 1000, 100))
    assert not isinstance(result, SwitchDecision)


def _shared_switch() -> tuple[FluidRolePolicy, Demand, SwitchDecision]:
    """2P2D for 1 req/s of 8K-token prompts with 1,600-token outputs, its decode pool full
    with requests waiting for its KV and its prefill workers busy 55 % of the time, after a
    peak of 1.4 req/s: the P->D switch the policy takes there."""
    d = Demand(1.0, 8000, 1600, float(MODEL.prefill.time(8000)), 1000, True, 1.4)
    policy = FluidRolePolicy(CFG, MODEL)
    decision = policy.observe(0.0, fleet(2, 2, 0.2, 1.0, 1.0, 0.55, waiting=2), d)
    assert isinstance(decision, SwitchDecision) and decision.source is Role.PREFILL
    return policy, d, decision


def test_a_prefill_donor_past_capacity_only_at_a_peak_the_split_kept_fails_too_may_go() -> None:
    _, _, decision = _shared_switch()
    f, margin = decision.forecast, CFG.gain_margin
    assert f is not None and f.prefill_donor
    # The one prefill worker left is past capacity at the peak, where 2P2D's decode pool is
    # too; at the window's rate it is within capacity by the margin.
    assert not donor_keeps_up(f) and f.burst_before >= 1.0
    assert f.donor_at_rate * (1.0 + margin) <= 1.0 and not f.loses_at_peak
    assert overload_shared(f, margin)
    assert worth_basis(f, margin, share=True) is WorthBasis.SHARED
    assert not overload_traded(f, margin)  # 2P2D is within capacity at the lower bound
    assert clearly_worth(f, margin, share=True)
    # Not as the budget's last switch, which no undo could follow, nor as an undo or a
    # reversal inside the cooldown, whose donors must keep up.
    assert not clearly_worth(f, margin, final=True, share=True)
    assert not clearly_worth(f, margin)
    # Each condition holds it back.
    assert not overload_shared(replace(f, burst_before=0.99), margin)
    assert not overload_shared(replace(f, donor_at_rate=0.95), margin)
    assert not overload_shared(replace(f, receiver_observed=False), margin)
    assert not overload_shared(replace(f, donor_observed=False), margin)
    # Arrivals burstier than Poisson's: the peak is one the trace will show again.
    assert f.arrival_cv2 == 1.0  # unknown: taken as Poisson's
    assert not overload_shared(replace(f, arrival_cv2=1.5), margin)
    losing = replace(f, peak_loss_after=f.peak_loss_before + 0.5)
    assert losing.loses_at_peak and not overload_shared(losing, margin)
    assert not clearly_worth(replace(f, burst_before=0.99), margin, share=True)
    # A decode donor past its capacity at the peak is never shared: at its KV edge a decode
    # pool stops admitting, and the requests that wait hold the KV they reserved.
    decode_donor = replace(f, donor_busy_after=math.inf)
    assert not decode_donor.prefill_donor and not overload_shared(decode_donor, margin)
    # A donor that keeps up at the peak is no shared overload, however it is taken.
    assert worth_basis(replace(f, donor_after=0.5), margin, share=True) is WorthBasis.KEEPS_UP


def test_a_switch_taken_on_a_shared_overload_is_not_reversed_inside_the_cooldown() -> None:
    # Its one prefill worker saturates while the decode pool idles, under the load the
    # switch was checked at: the refutation that undoes an ordinary switch inside the
    # cooldown. Here the forecast accepted a donor past capacity at the peak, so the split
    # waits out the cooldown, and eq. (22) asking for D->P meanwhile is shut out too.
    policy, d, first = _shared_switch()
    policy.switch_finished(first.worker, 1.0)
    starved = fleet(1, 3, 3.0, 0.1, 0.1, busy=0.99)
    for t in (12.0, 60.0, 120.0, 200.0, 290.0, 300.0):
        assert not isinstance(policy.observe(t, starved, d), SwitchDecision)
    assert policy.undone == 0
    # Past the cooldown a donor still starved is refuted as any switch's, and moved back.
    back = policy.observe(301.0, starved, d)
    assert isinstance(back, SwitchDecision)
    assert back.source is Role.DECODE and back.target is Role.PREFILL
