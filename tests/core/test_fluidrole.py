"""FluidRole: pool pressure (eqs. 20-21), switch conditions (eqs. 22-23) and the stateful policy."""

from __future__ import annotations

import pytest

from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    FluidRolePolicy,
    PoolPressure,
    Recommendation,
    SwitchDecision,
    WorkerSignals,
    decode_pool_pressure,
    prefill_pool_pressure,
    recommend,
    wants_decode_to_prefill,
    wants_prefill_to_decode,
    windowed_percentile,
)
from fluidpd.core.types import DrainMode, Role, RoleState

CFG = FluidRoleConfig(
    ppi_low=0.6,
    ppi_high=1.0,
    dpi_load_high=0.6,
    dpi_adm_high=0.2,
    interval_s=1.0,
    window_s=10.0,
    n_persist=3,
    cooldown_s=5.0,
    reversal_cooldown_s=30.0,
)


def psig(
    name: str, ppi: float = 0.0, cost: float = 0.0, state: RoleState = RoleState.ACTIVE
) -> WorkerSignals:
    return WorkerSignals(name, Role.PREFILL, state, queue_ppi=ppi, drain_cost=cost)


def dsig(
    name: str,
    load: float = 0.0,
    adm: float = 0.0,
    cost: float = 0.0,
    state: RoleState = RoleState.ACTIVE,
) -> WorkerSignals:
    return WorkerSignals(name, Role.DECODE, state, dpi_load=load, dpi_adm=adm, drain_cost=cost)


def hot_prefill(n_decode: int = 3, costs: tuple[float, ...] = ()) -> list[WorkerSignals]:
    """Fleet whose pressure calls for D->P (PPI high, decode lightly loaded)."""
    costs = costs or tuple(float(i) for i in range(n_decode))
    return [psig("p0", ppi=2.0)] + [dsig(f"d{i}", load=0.1, cost=c) for i, c in enumerate(costs)]


def hot_decode(n_prefill: int = 3, costs: tuple[float, ...] = ()) -> list[WorkerSignals]:
    """Fleet whose pressure calls for P->D (KV admission high, prefill idle)."""
    costs = costs or tuple(float(i) for i in range(n_prefill))
    return [psig(f"p{i}", ppi=0.1, cost=c) for i, c in enumerate(costs)] + [dsig("d0", adm=0.9)]


def quiet() -> list[WorkerSignals]:
    return [psig("p0", ppi=0.8), psig("p1", ppi=0.8), dsig("d0", load=0.1), dsig("d1", load=0.1)]


# --------------------------------------------------------------------------------------------
# Eqs. (20)-(23)
# --------------------------------------------------------------------------------------------


def test_windowed_percentile_linear_interpolation() -> None:
    # Sorted [0.1 x 9, 5.0]: the 95th percentile sits at rank 0.95 * 9 = 8.55, i.e. 0.1 plus
    # 0.55 of the way to 5.0.
    assert windowed_percentile([5.0] + [0.1] * 9, 95) == pytest.approx(0.1 + 0.55 * 4.9)
    assert windowed_percentile([1.0, 2.0, 3.0], 100) == 3.0
    assert windowed_percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert windowed_percentile([], 95) == 0.0


def test_eq20_pool_ppi_is_max_over_workers() -> None:
    assert prefill_pool_pressure([0.3, 1.7, 0.9]) == 1.7
    assert prefill_pool_pressure([]) == 0.0


def test_eq21_decode_pool_averages() -> None:
    load, adm = decode_pool_pressure([0.2, 0.4, 0.9], [0.1, 0.5, 0.6])
    assert load == pytest.approx(0.5)
    assert adm == pytest.approx(0.4)
    assert decode_pool_pressure([], []) == (0.0, 0.0)


def test_eq20_policy_window_p95_max_over_workers_and_expiry() -> None:
    pol = FluidRolePolicy(FluidRoleConfig(window_s=10.0, n_persist=100))
    # p0 spikes once at t = 0, then stays at 0.1; p1 sits at 0.5.
    for t in range(10):
        ppi0 = 5.0 if t == 0 else 0.1
        pol.observe(float(t), [psig("p0", ppi0), psig("p1", 0.5), dsig("d0")])
    # Window at t = 9 holds t = 0..9 for both workers.
    assert pol.last_pressure.ppi_bar == pytest.approx(0.1 + 0.55 * 4.9)
    # At t = 10 the t = 0 sample is exactly window_s old and drops out; p1 now dominates.
    pol.observe(10.0, [psig("p0", 0.1), psig("p1", 0.5), dsig("d0")])
    assert pol.last_pressure.ppi_bar == pytest.approx(0.5)


def test_eq20_21_non_active_workers_are_ignored() -> None:
    pol = FluidRolePolicy(FluidRoleConfig(n_persist=100))
    workers = [
        psig("p0", 0.3),
        psig("p1", 9.0, state=RoleState.DRAIN),  # a draining prefill worker's PPI does not count
        dsig("d0", load=0.2, adm=0.4),
        dsig("d1", load=0.4, adm=0.6),
        dsig("d2", load=1.0, adm=1.0, state=RoleState.SWITCH),
    ]
    pol.observe(0.0, workers)
    assert pol.last_pressure.ppi_bar == pytest.approx(0.3)
    assert pol.last_pressure.dpi_load_bar == pytest.approx(0.3)
    assert pol.last_pressure.dpi_adm_bar == pytest.approx(0.5)


def test_eq22_decode_to_prefill_strict_thresholds() -> None:
    assert wants_decode_to_prefill(PoolPressure(1.01, 0.59, 0.0), CFG)
    assert not wants_decode_to_prefill(PoolPressure(1.0, 0.1, 0.0), CFG)  # PPI must exceed
    assert not wants_decode_to_prefill(PoolPressure(2.0, 0.6, 0.0), CFG)  # load must be below


def test_eq23_prefill_to_decode_strict_thresholds() -> None:
    assert wants_prefill_to_decode(PoolPressure(0.59, 0.0, 0.21), CFG)
    assert not wants_prefill_to_decode(PoolPressure(0.6, 0.0, 0.9), CFG)  # PPI must be below
    assert not wants_prefill_to_decode(PoolPressure(0.1, 0.0, 0.2), CFG)  # adm must exceed


@pytest.mark.parametrize(
    ("pressure", "expected"),
    [
        (PoolPressure(2.0, 0.1, 0.0, 4, 4), Recommendation.D_TO_P),
        (PoolPressure(2.0, 0.1, 0.7, 4, 4), Recommendation.D_TO_P),  # load and KV have room
        # Load has headroom but 3 decode workers could not hold the KV already committed.
        (PoolPressure(2.0, 0.1, 0.95, 4, 4), Recommendation.NEEDS_CAPACITY),
        (PoolPressure(0.1, 0.1, 0.9, 4, 4), Recommendation.P_TO_D),
        (PoolPressure(0.1, 0.9, 0.9, 4, 4), Recommendation.P_TO_D),
        (PoolPressure(2.0, 0.6, 0.9, 4, 4), Recommendation.NEEDS_CAPACITY),  # both phases hot
        (PoolPressure(2.0, 0.9, 0.0, 4, 4), Recommendation.NEEDS_CAPACITY),
        (PoolPressure(0.8, 0.1, 0.9, 4, 4), Recommendation.NONE),  # PPI between low and high
        (PoolPressure(0.8, 0.9, 0.0, 4, 4), Recommendation.NONE),
        (PoolPressure(0.0, 0.0, 0.0, 4, 4), Recommendation.NONE),
        # Eq. (22) holds, but 3 decode workers would carry 0.5 * 4/3 > 0.6: no D->P.
        (PoolPressure(2.0, 0.5, 0.0, 4, 4), Recommendation.NEEDS_CAPACITY),
        # Eq. (23) holds, but 3 prefill workers would see PPI 0.5 * 4/3 > 0.6: no P->D.
        (PoolPressure(0.5, 0.0, 0.9, 4, 4), Recommendation.NONE),
        # A pool of one can never spare a worker.
        (PoolPressure(2.0, 0.0, 0.0, 4, 1), Recommendation.NEEDS_CAPACITY),
        (PoolPressure(0.0, 0.0, 0.9, 1, 4), Recommendation.NONE),
    ],
)
def test_recommend(pressure: PoolPressure, expected: Recommendation) -> None:
    assert recommend(pressure, CFG) is expected


# --------------------------------------------------------------------------------------------
# The stateful policy
# --------------------------------------------------------------------------------------------


def test_no_switch_before_n_persist_agreeing_intervals() -> None:
    pol = FluidRolePolicy(CFG)
    assert pol.observe(0.0, hot_prefill()) is Recommendation.NONE
    assert pol.observe(1.0, hot_prefill()) is Recommendation.NONE
    decision = pol.observe(2.0, hot_prefill())
    assert isinstance(decision, SwitchDecision)
    assert (decision.source, decision.target) == (Role.DECODE, Role.PREFILL)


def test_interrupted_streak_starts_over() -> None:
    cfg = FluidRoleConfig(n_persist=3, window_s=1.0, interval_s=1.0)  # no PPI memory
    pol = FluidRolePolicy(cfg)
    pol.observe(0.0, hot_prefill())
    pol.observe(1.0, hot_prefill())
    assert pol.observe(2.0, quiet()) is Recommendation.NONE
    assert pol.observe(3.0, hot_prefill()) is Recommendation.NONE
    assert pol.observe(4.0, hot_prefill()) is Recommendation.NONE
    assert isinstance(pol.observe(5.0, hot_prefill()), SwitchDecision)


def test_alternating_recommendations_never_switch() -> None:
    cfg = FluidRoleConfig(n_persist=2, window_s=1.0, interval_s=1.0, cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    for t in range(20):
        workers = hot_prefill() if t % 2 else hot_decode()
        assert pol.observe(float(t), workers) is Recommendation.NONE


def test_one_switch_in_flight() -> None:
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    first = pol.observe(0.0, hot_prefill(4))
    assert isinstance(first, SwitchDecision)
    assert pol.switching == first.worker
    # The harness has not even started the drain yet (everyone still Active): no new decision.
    for t in range(1, 10):
        assert pol.observe(float(t), hot_prefill(4)) is Recommendation.NONE
    pol.switch_finished(first.worker, 10.0)
    assert pol.switching is None
    second = pol.observe(10.0, hot_prefill(4))
    assert isinstance(second, SwitchDecision)


def test_resumed_switch_blocks_a_second_one() -> None:
    """A restarted harness restores the in-flight switch; the policy waits for it to finish."""
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    pol.switch_resumed("d0")
    assert pol.switching == "d0"
    for t in range(5):
        assert pol.observe(float(t), hot_prefill(4)) is Recommendation.NONE
    pol.switch_finished("d0", 5.0)
    assert isinstance(pol.observe(5.0, hot_prefill(4)), SwitchDecision)


def test_cooldown_after_switch() -> None:
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=5.0, reversal_cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    d = pol.observe(0.0, hot_prefill(4))
    assert isinstance(d, SwitchDecision)
    pol.switch_finished(d.worker, 3.0)
    for t in (3.0, 4.0, 5.0, 6.0, 7.0, 7.99):
        assert pol.observe(t, hot_prefill(4)) is Recommendation.NONE
    assert isinstance(pol.observe(8.0, hot_prefill(4)), SwitchDecision)


def test_reversal_cooldown() -> None:
    cfg = FluidRoleConfig(
        n_persist=1, window_s=1.0, interval_s=1.0, cooldown_s=2.0, reversal_cooldown_s=50.0
    )
    pol = FluidRolePolicy(cfg)
    d = pol.observe(0.0, hot_prefill(4))
    assert isinstance(d, SwitchDecision) and d.target is Role.PREFILL
    pol.switch_finished(d.worker, 10.0)
    # The opposite direction waits for the reversal cooldown ...
    for t in (12.0, 20.0, 40.0, 59.0):
        assert pol.observe(t, hot_decode(4)) is Recommendation.NONE
    # ... while the same direction only waits for the ordinary cooldown.
    same = FluidRolePolicy(cfg)
    d2 = same.observe(0.0, hot_prefill(4))
    assert isinstance(d2, SwitchDecision)
    same.switch_finished(d2.worker, 10.0)
    assert isinstance(same.observe(12.0, hot_prefill(4)), SwitchDecision)
    # After the reversal cooldown the opposite switch goes ahead.
    rev = pol.observe(60.0, hot_decode(4))
    assert isinstance(rev, SwitchDecision)
    assert (rev.source, rev.target) == (Role.PREFILL, Role.DECODE)


def test_never_below_min_decode() -> None:
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0, min_decode=2)
    pol = FluidRolePolicy(cfg)
    fleet = hot_prefill(3)
    d = pol.observe(0.0, fleet)
    assert isinstance(d, SwitchDecision)
    pol.switch_finished(d.worker, 0.0)
    # The switched worker is now a prefill worker: two decode workers left = min_decode.
    fleet = [psig(d.worker, 2.0)] + [w for w in fleet if w.worker != d.worker]
    for t in range(1, 10):
        assert pol.observe(float(t), fleet) is Recommendation.NONE
    assert sum(w.role is Role.DECODE for w in fleet) == 2


def test_never_below_min_prefill() -> None:
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0, min_prefill=2)
    pol = FluidRolePolicy(cfg)
    pair = [psig("p0", 0.1), psig("p1", 0.1), dsig("d0", adm=0.9), dsig("d1", adm=0.9)]
    for t in range(5):
        assert pol.observe(float(t), pair) is Recommendation.NONE
    assert pol.last_recommendation is Recommendation.P_TO_D


def test_candidate_is_least_drain_cost() -> None:
    pol = FluidRolePolicy(FluidRoleConfig(n_persist=1))
    d = pol.observe(0.0, hot_prefill(3, costs=(7.0, 2.0, 5.0)))
    assert isinstance(d, SwitchDecision)
    assert d.worker == "d1"
    pol2 = FluidRolePolicy(FluidRoleConfig(n_persist=1))
    d = pol2.observe(0.0, hot_decode(3, costs=(0.5, 0.25, 3.0)))
    assert isinstance(d, SwitchDecision)
    assert d.worker == "p1"
    # Ties go to the lowest worker id.
    pol3 = FluidRolePolicy(FluidRoleConfig(n_persist=1))
    d = pol3.observe(0.0, [psig("p0", 2.0), dsig("d9", cost=1.0), dsig("d3", cost=1.0)])
    assert isinstance(d, SwitchDecision)
    assert d.worker == "d3"


def test_drain_modes() -> None:
    for mode in (DrainMode.WAIT, DrainMode.MIGRATE):
        pol = FluidRolePolicy(FluidRoleConfig(n_persist=1, drain_mode=mode))
        d = pol.observe(0.0, hot_prefill())
        assert isinstance(d, SwitchDecision)
        assert d.drain_mode is mode  # D->P uses the configured mode
        pol = FluidRolePolicy(FluidRoleConfig(n_persist=1, drain_mode=mode))
        d = pol.observe(0.0, hot_decode())
        assert isinstance(d, SwitchDecision)
        assert d.drain_mode is DrainMode.WAIT  # P->D always waits for the running batch


def test_disabled_policy_never_switches() -> None:
    cfg = FluidRoleConfig(enabled=False, n_persist=1, window_s=1.0, cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    for t in range(10):
        workers = hot_prefill(4) if t < 5 else hot_decode(4)
        out = pol.observe(float(t), workers)
        assert not isinstance(out, SwitchDecision)
        assert out is Recommendation.NONE
    # It still measures pressure (the simulator's time series and autoscaler read it).
    assert pol.last_recommendation is Recommendation.P_TO_D


def test_needs_capacity_after_persisting() -> None:
    pol = FluidRolePolicy(FluidRoleConfig(n_persist=2))
    both = [
        psig("p0", 3.0),
        psig("p1", 0.1),
        dsig("d0", load=0.9, adm=0.9),
        dsig("d1", load=0.9, adm=0.9),
    ]
    assert pol.observe(0.0, both) is Recommendation.NONE
    assert pol.observe(1.0, both) is Recommendation.NEEDS_CAPACITY
    assert pol.switching is None


def test_non_active_worker_blocks_decisions() -> None:
    cfg = FluidRoleConfig(n_persist=1, cooldown_s=0.0, reversal_cooldown_s=0.0)
    pol = FluidRolePolicy(cfg)
    fleet = hot_prefill(4)
    fleet[2] = dsig("d1", load=0.1, state=RoleState.DRAIN)  # someone else is mid-switch
    for t in range(5):
        assert pol.observe(float(t), fleet) is Recommendation.NONE
    fleet[2] = dsig("d1", load=0.1, state=RoleState.SWITCH)
    assert pol.observe(5.0, fleet) is Recommendation.NONE
    fleet[2] = dsig("d1", load=0.1)
    assert isinstance(pol.observe(6.0, fleet), SwitchDecision)


def test_non_active_workers_are_not_candidates() -> None:
    pol = FluidRolePolicy(FluidRoleConfig(n_persist=1))
    workers = [psig("p0", 2.0), dsig("d0", cost=0.0, state=RoleState.DRAIN), dsig("d1", cost=5.0)]
    assert pol.pick_candidate(workers, Role.DECODE) is None  # only one Active decode left
    workers.append(dsig("d2", cost=9.0))
    cand = pol.pick_candidate(workers, Role.DECODE)
    assert cand is not None and cand.worker == "d1"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ppi_low": 1.5, "ppi_high": 1.0},
        {"interval_s": 0.0},
        {"interval_s": 5.0, "window_s": 1.0},
        {"n_persist": 0},
        {"cooldown_s": -1.0},
        {"reversal_cooldown_s": -1.0},
        {"min_prefill": 0},
        {"min_decode": 0},
        {"percentile": 0.0},
    ],
)
def test_config_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FluidRoleConfig(**kwargs)  # type: ignore[arg-type]


def test_reversal_allowed_when_the_helped_phase_is_saturated() -> None:
    cfg = FluidRoleConfig(
        n_persist=1, window_s=1.0, interval_s=1.0, cooldown_s=2.0, reversal_cooldown_s=50.0
    )
    # After a D->P switch, decode KV runs full: the P->D reversal does not wait.
    pol = FluidRolePolicy(cfg)
    d = pol.observe(0.0, hot_prefill(4))
    assert isinstance(d, SwitchDecision)
    pol.switch_finished(d.worker, 10.0)
    mild = [psig(f"p{i}", ppi=0.1) for i in range(3)] + [dsig("d0", adm=0.9)]
    assert pol.observe(12.0, mild) is Recommendation.NONE  # P->D wanted, stabilizing
    full = [psig(f"p{i}", ppi=0.1) for i in range(3)] + [dsig("d0", adm=0.96)]
    rev = pol.observe(13.0, full)
    assert isinstance(rev, SwitchDecision) and rev.target is Role.DECODE
    # After a P->D switch, prefill falls far behind: the D->P reversal does not wait either.
    pol2 = FluidRolePolicy(cfg)
    d2 = pol2.observe(0.0, hot_decode(4))
    assert isinstance(d2, SwitchDecision)
    pol2.switch_finished(d2.worker, 10.0)
    hot = [psig("p0", ppi=1.5)] + [dsig(f"d{i}", load=0.1) for i in range(4)]
    assert pol2.observe(12.0, hot) is Recommendation.NONE
    burning = [psig("p0", ppi=3.0)] + [dsig(f"d{i}", load=0.1) for i in range(4)]
    assert isinstance(pol2.observe(13.0, burning), SwitchDecision)


def test_past_the_horizon_a_saturated_phase_waits_out_the_reversal_cooldown() -> None:
    # The forecast speaks for horizon_s: a saturation after it is the load's doing, and the
    # reversal waits for the reversal cooldown.
    cfg = FluidRoleConfig(
        n_persist=1,
        window_s=1.0,
        interval_s=1.0,
        cooldown_s=2.0,
        reversal_cooldown_s=100.0,
        horizon_s=20.0,
    )
    pol = FluidRolePolicy(cfg)
    d = pol.observe(0.0, hot_prefill(4))
    assert isinstance(d, SwitchDecision)
    pol.switch_finished(d.worker, 10.0)
    full = [psig(f"p{i}", ppi=0.1) for i in range(3)] + [dsig("d0", adm=0.96)]
    for t in (30.0, 31.0, 60.0, 109.9):
        assert pol.observe(t, full) is Recommendation.NONE
    assert pol.last_recommendation is Recommendation.P_TO_D
    rev = pol.observe(110.0, full)
    assert isinstance(rev, SwitchDecision) and rev.target is Role.DECODE
