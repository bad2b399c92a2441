"""The harnesses' shared feed of the FluidRole policy (``fluidpd.core.role_control``): the
router's numbered arrival log, and ``RoleControl``, through which the simulator and the live
controller give the predictive rule the same demand."""

from __future__ import annotations

import pytest

from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    Recommendation,
    SwitchDecision,
    SwitchRule,
    WorkerSignals,
)
from fluidpd.core.profile import Profile
from fluidpd.core.role_control import DEMAND_WINDOW_S, ArrivalLog, RoleControl
from fluidpd.core.types import SLO, Role, RoleState
from fluidpd.profiles import resolve_profile

SLO_ = SLO(2.0, 0.1)
CFG = FluidRoleConfig(n_persist=1, window_s=1.0)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return resolve_profile("llama-3.1-8b", "a100-80gb", None)


def test_log_numbers_arrivals_and_a_cursor_reads_only_the_new_ones() -> None:
    log = ArrivalLog()
    for i in range(3):
        log.add(float(i), 100 + i, 10)
    first = log.since(None)
    assert (first.next, first.dropped) == (3, 0)
    assert [a.prompt for a in first.arrivals] == [100, 101, 102]
    log.add(3.0, 103, 10)
    again = log.since(first.next)
    assert (again.next, again.dropped, [a.prompt for a in again.arrivals]) == (4, 0, [103])
    assert log.since(again.next).arrivals == []


def test_log_counts_what_it_forgot_and_keeps_the_newest() -> None:
    log = ArrivalLog(capacity=4)
    for i in range(10):
        log.add(float(i), 1 + i, 0)
    batch = log.since(0)
    assert batch.dropped == 6 and [a.prompt for a in batch.arrivals] == [7, 8, 9, 10]
    limited = log.since(6, limit=2)
    assert limited.dropped == 2 and [a.prompt for a in limited.arrivals] == [9, 10]
    assert limited.next == 10


def test_a_cursor_of_another_log_reads_all_this_one_keeps() -> None:
    log = ArrivalLog()
    log.add(0.0, 5, 1)
    batch = log.since(1_000)
    assert (batch.dropped, [a.prompt for a in batch.arrivals]) == (0, [5])


def _fleet(n_p: int, n_d: int, ppi: float) -> list[WorkerSignals]:
    prefill = [
        WorkerSignals(f"p{i}", Role.PREFILL, RoleState.ACTIVE, ppi, 0.0, 0.0) for i in range(n_p)
    ]
    decode = [
        WorkerSignals(f"d{i}", Role.DECODE, RoleState.ACTIVE, 0.0, 0.05, 0.05, float(i))
        for i in range(n_d)
    ]
    return prefill + decode


def _feed(rc: RoleControl, rate: float, prompt: int, output: int, until: float) -> None:
    n = int(rate * until)
    for i in range(n):
        rc.arrived(i / rate, prompt, output)


def test_without_profile_or_feed_the_policy_decides_as_the_paper(profile: Profile) -> None:
    assert not RoleControl.create(CFG, None, SLO_).predictive
    assert not RoleControl.create(CFG, profile, SLO_, fed=False).predictive
    assert not RoleControl.create(
        FluidRoleConfig(switch_rule=SwitchRule.PAPER), profile, SLO_
    ).predictive
    rc = RoleControl.create(CFG, profile, SLO_, fed=False)
    rc.arrived(0.0, 1000, 10)  # ignored: no window
    decision = rc.observe(1.0, _fleet(1, 3, 3.0))
    assert isinstance(decision, SwitchDecision) and decision.forecast is None


def test_arrivals_feed_the_forecast_a_mismatched_split_switches(profile: Profile) -> None:
    rc = RoleControl.create(CFG, profile, SLO_)
    assert rc.predictive and rc.demand is not None
    assert rc.demand.window_s == DEMAND_WINDOW_S
    # 12 req/s of 4,500-token prompts: far beyond one prefill worker.
    _feed(rc, 12.0, 4500, 8, 10.0)
    decision = rc.observe(10.0, _fleet(1, 3, 3.0))
    assert isinstance(decision, SwitchDecision) and decision.source is Role.DECODE
    assert decision.forecast is not None and decision.forecast.gain > decision.forecast.cost
    assert rc.last_demand is not None and rc.last_demand.rate == pytest.approx(12.0, rel=0.05)
    assert rc.last_demand.prompt == 4500


def test_a_matched_split_is_declined_though_the_paper_rule_would_switch(
    profile: Profile,
) -> None:
    cfg = FluidRoleConfig(n_persist=1, window_s=1.0, ppi_low=0.05, ppi_high=0.05)
    # Two prefill workers carry 2 req/s of 1,500-token prompts easily.
    signals = _fleet(2, 2, 0.5)
    paper = RoleControl.create(cfg, profile, SLO_, fed=False)
    assert isinstance(paper.observe(10.0, signals), SwitchDecision)
    rc = RoleControl.create(cfg, profile, SLO_)
    _feed(rc, 2.0, 1500, 8, 30.0)
    assert rc.observe(30.0, signals) is Recommendation.NONE
    assert rc.policy.refused == 1 and rc.policy.last_forecast is not None
    assert rc.policy.last_forecast.gain == pytest.approx(0.0, abs=1e-9)


def test_an_interval_without_its_arrivals_takes_no_predictive_switch(profile: Profile) -> None:
    rc = RoleControl.create(CFG, profile, SLO_)
    _feed(rc, 12.0, 4500, 8, 10.0)
    assert rc.observe(10.0, _fleet(1, 3, 3.0), demand_current=False) is Recommendation.NONE
    assert rc.last_demand is not None and not rc.last_demand.reliable
