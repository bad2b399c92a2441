"""Property tests for FluidToken: Algorithm 1 (plan_stealing), budgets (eqs. 12-17), eq. 16.

The reference oracle below is a plain loop transcription of the paper's Algorithm 1. Times in the
oracle-equivalence and brute-force tests live on a coarse grid (integer predictor coefficients,
integer or half-integer deadlines), so every quantity the two implementations compare is exact
in floating point and no decision sits on a rounding tie.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fluidpd.core.fluidtoken import (
    SUFFIX_QUEUE_ITERATIONS,
    FluidTokenConfig,
    IterationError,
    KvIntake,
    _donor_caps,
    _head_cap,
    _suffix_cap,
    _suffix_caps,
    advertised_budget,
    kv_occupancy_forecast,
    max_admissible_suffix,
    plan_stealing,
    steal_budget,
    stealing_allowed,
    stream_tpot_room,
)
from fluidpd.core.predictors import DecodeIterPredictor, PrefillPredictor, SuffixPredictor
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.signals import steal_ppi
from fluidpd.core.types import SLO, Request, Role
from fluidpd.profiles import resolve_profile

# --------------------------------------------------------------------------------------------
# Reference oracle: Algorithm 1, line by line.
# --------------------------------------------------------------------------------------------


def _oracle_caps(
    lengths: list[int],
    deadlines: list[float],
    now: float,
    backlog: float,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
) -> list[int]:
    """The donor cap (`_donor_caps`' rule), computed by enumeration instead of a closed form.

    A request already predicted to miss its deadline (X_j > 0 with no stealing) may give every
    token. Any other request j may give x tokens only while it stays TTFT-schedulable under the
    affine saving: T_sfx(y) - c1 y <= slack_j for every 1 <= y <= x.
    """
    caps: list[int] = []
    work = backlog
    for length, ddl in zip(lengths, deadlines, strict=True):
        work += prefill.time(length)
        slack = (ddl - now) - work
        if slack < 0:  # violating: X_j > 0
            caps.append(length)
            continue
        x = 0
        while x < length and suffix.time(x + 1) - prefill.c1 * (x + 1) <= slack:
            x += 1
        caps.append(x)
    return caps


def oracle_algorithm1(
    lengths: list[int],
    deadlines: list[float],
    decode_index: list[int],
    budgets: list[float],
    now: float,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
    backlog: float = 0.0,
) -> list[int]:
    """Algorithm 1 of the paper (plus the donor cap); X_i from eq. (19) on the current state."""
    n = len(lengths)
    stolen = [0] * n  # line 3
    budget = [math.floor(max(b, 0.0)) for b in budgets]  # line 4 (whole tokens)
    caps = _oracle_caps(lengths, deadlines, now, backlog, prefill, suffix)
    for i in range(n):  # line 5
        # Line 6, eq. (19) with the current stolen vector: sum of prefix work up to i, and i's
        # prefix deadline t_i^ddl - T_sfx(stolen_i) (eq. 9).
        work = backlog + sum(prefill.time(lengths[k] - stolen[k]) for k in range(i + 1))
        pfx_ddl = deadlines[i] - suffix.time(stolen[i])
        x_i = (work - (pfx_ddl - now)) / prefill.c1
        if x_i <= 0:  # lines 7-9
            continue
        need = math.ceil(x_i)  # line 10, in whole tokens
        for j in range(i):  # line 11, earliest request first
            if need <= 0:  # lines 12-14
                break
            d = decode_index[j]  # line 15
            take = min(need, caps[j] - stolen[j], budget[d])  # line 16 (+ donor cap)
            take = max(take, 0)
            stolen[j] += take  # line 17
            budget[d] -= take  # line 18
            need -= take  # line 19
    return stolen


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------


@st.composite
def grid_instances(draw: st.DrawFn) -> dict[str, object]:
    """Queues on a half-integer grid: c2 = 0, integer coefficients, deadlines = k + 0.5.

    Every slack and every deficit is then a half-integer (over c1), so no comparison in either
    implementation is a float tie.
    """
    n = draw(st.integers(1, 9))
    n_decode = draw(st.integers(1, 3))
    c1 = draw(st.integers(1, 3))
    c0 = draw(st.integers(0, 4))
    s1 = draw(st.integers(1, 5))
    s0 = draw(st.integers(0, 5))
    s2 = draw(st.sampled_from([0, 0, 1]))
    now = float(draw(st.integers(0, 40)))
    lengths = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    rel = draw(st.lists(st.integers(-10, 120), min_size=n, max_size=n))
    deadlines = [now + r + 0.5 for r in rel]
    decode_index = draw(st.lists(st.integers(0, n_decode - 1), min_size=n, max_size=n))
    budgets = draw(
        st.lists(
            st.one_of(st.integers(0, 60).map(float), st.floats(0.0, 60.0)),
            min_size=n_decode,
            max_size=n_decode,
        )
    )
    backlog = float(draw(st.integers(0, 6)))
    return {
        "lengths": lengths,
        "deadlines": deadlines,
        "decode_index": decode_index,
        "budgets": budgets,
        "now": now,
        "prefill": PrefillPredictor(c1=float(c1), c0=float(c0)),
        "suffix": SuffixPredictor(s1=float(s1), s0=float(s0), s2=float(s2)),
        "backlog": backlog,
    }


def _plan(inst: dict[str, object], head_only: bool = False) -> np.ndarray:
    plan = plan_stealing(
        np.asarray(inst["lengths"], dtype=np.int64),
        np.asarray(inst["deadlines"], dtype=np.float64),
        np.asarray(inst["decode_index"], dtype=np.int64),
        np.asarray(inst["budgets"], dtype=np.float64),
        inst["now"],  # type: ignore[arg-type]
        inst["prefill"],  # type: ignore[arg-type]
        inst["suffix"],  # type: ignore[arg-type]
        inst["backlog"],  # type: ignore[arg-type]
        head_only=head_only,
    )
    return plan.stolen


@st.composite
def realistic_instances(draw: st.DrawFn) -> dict[str, object]:
    """Seconds-scale queues with arbitrary (quadratic, costly-suffix) predictors."""
    n = draw(st.integers(1, 24))
    n_decode = draw(st.integers(1, 4))
    c1 = draw(st.floats(1e-5, 5e-4))
    c0 = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.05)))
    c2 = draw(st.one_of(st.just(0.0), st.floats(1e-10, 1e-7)))
    # s1 below, equal to and above c1; s0 = 0 and s0 > 0.
    s1 = draw(st.one_of(st.just(c1), st.floats(1e-5, 1e-3)))
    s0 = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.2)))
    s2 = draw(st.one_of(st.just(0.0), st.floats(1e-10, 1e-7)))
    now = draw(st.floats(0.0, 100.0))
    lengths = draw(st.lists(st.integers(1, 4000), min_size=n, max_size=n))
    rel = draw(st.lists(st.floats(-1.0, 8.0), min_size=n, max_size=n))
    decode_index = draw(st.lists(st.integers(0, n_decode - 1), min_size=n, max_size=n))
    budgets = draw(st.lists(st.floats(0.0, 6000.0), min_size=n_decode, max_size=n_decode))
    backlog = draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0)))
    return {
        "lengths": lengths,
        "deadlines": [now + r for r in rel],
        "decode_index": decode_index,
        "budgets": budgets,
        "now": now,
        "prefill": PrefillPredictor(c1=c1, c0=c0, c2=c2),
        "suffix": SuffixPredictor(s1=s1, s0=s0, s2=s2),
        "backlog": backlog,
    }


def _violations(inst: dict[str, object], stolen: np.ndarray) -> int:
    ppi = steal_ppi(
        np.asarray(inst["lengths"], dtype=np.int64),
        np.asarray(stolen, dtype=np.int64),
        np.asarray(inst["deadlines"], dtype=np.float64),
        inst["now"],  # type: ignore[arg-type]
        inst["prefill"],  # type: ignore[arg-type]
        inst["suffix"],  # type: ignore[arg-type]
        inst["backlog"],  # type: ignore[arg-type]
    )
    return int(np.count_nonzero(ppi > 1.0))


# --------------------------------------------------------------------------------------------
# Oracle equivalence
# --------------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(grid_instances())
def test_plan_stealing_equals_algorithm1_loop(inst: dict[str, object]) -> None:
    expected = oracle_algorithm1(
        inst["lengths"],  # type: ignore[arg-type]
        inst["deadlines"],  # type: ignore[arg-type]
        inst["decode_index"],  # type: ignore[arg-type]
        inst["budgets"],  # type: ignore[arg-type]
        inst["now"],  # type: ignore[arg-type]
        inst["prefill"],  # type: ignore[arg-type]
        inst["suffix"],  # type: ignore[arg-type]
        inst["backlog"],  # type: ignore[arg-type]
    )
    assert _plan(inst).tolist() == expected


def test_oracle_is_not_trivial() -> None:
    """Guard for the oracle test: on a pressured queue both sides steal something."""
    inst: dict[str, object] = {
        "lengths": [10, 10, 10, 10],
        "deadlines": [100.5, 12.5, 22.5, 30.5],
        "decode_index": [0, 1, 0, 1],
        "budgets": [6.0, 4.0],
        "now": 0.0,
        "prefill": PrefillPredictor(c1=1.0, c0=0.0),
        "suffix": SuffixPredictor(s1=1.0, s0=0.0),
        "backlog": 0.0,
    }
    expected = oracle_algorithm1(**inst)  # type: ignore[arg-type]
    assert sum(expected) > 0
    assert _plan(inst).tolist() == expected


def test_plan_stealing_hand_example() -> None:
    """A worked example: request 1 is 20 tokens late and request 0 can give them."""
    prefill = PrefillPredictor(c1=0.01, c0=0.1)
    suffix = SuffixPredictor(s1=0.02, s0=0.05)
    lengths = np.array([100, 200, 50])
    deadlines = np.array([3.0, 4.0, 5.0])  # arrivals 0, 1, 2 with S_TTFT = 3
    idx = np.zeros(3, dtype=np.int64)
    # Deficits with no stealing: cumulative work 1.1, 3.2, 3.8 vs remaining 2, 3, 4 -> X_1 = 20.
    plan = plan_stealing(lengths, deadlines, idx, np.array([100.0]), 1.0, prefill, suffix)
    assert plan.stolen.tolist() == [20, 0, 0]
    assert plan.ppi == pytest.approx(3.2 / 3.0)
    # Budget-limited.
    plan = plan_stealing(lengths, deadlines, idx, np.array([10.9]), 1.0, prefill, suffix)
    assert plan.stolen.tolist() == [10, 0, 0]
    # Request 0's donor cap: 0.02 x + 0.05 - 0.01 x <= 0.9 -> x <= 85 (tokens beyond would make
    # request 0 itself late), so a huge need is capped at 84 or 85 tokens, never more.
    late = np.array([3.0, 1.5, 5.0])
    plan = plan_stealing(lengths, late, idx, np.array([1000.0]), 1.0, prefill, suffix)
    assert 84 <= plan.stolen[0] <= 85
    assert plan.betas(lengths)[0] == pytest.approx(plan.stolen[0] / 100)
    # A queue that is already schedulable steals nothing.
    easy = np.array([30.0, 30.0, 30.0])
    plan = plan_stealing(lengths, easy, idx, np.array([1000.0]), 1.0, prefill, suffix)
    assert plan.stolen.tolist() == [0, 0, 0]
    assert plan.ppi <= 1.0


# --------------------------------------------------------------------------------------------
# Budgets and ratio bounds
# --------------------------------------------------------------------------------------------


def _check_bounds(inst: dict[str, object], stolen: np.ndarray) -> None:
    lengths = np.asarray(inst["lengths"])
    idx = np.asarray(inst["decode_index"])
    assert stolen.shape == lengths.shape
    assert np.all(stolen >= 0)
    assert np.all(stolen <= lengths)
    betas = stolen / lengths
    assert np.all((betas >= 0) & (betas <= 1))
    for d, b in enumerate(inst["budgets"]):  # type: ignore[arg-type]
        assert stolen[idx == d].sum() <= math.floor(b), (d, b, stolen.tolist())


@settings(max_examples=300, deadline=None)
@given(realistic_instances())
def test_budgets_never_exceeded_realistic(inst: dict[str, object]) -> None:
    _check_bounds(inst, _plan(inst))


@settings(max_examples=200, deadline=None)
@given(grid_instances())
def test_budgets_never_exceeded_grid(inst: dict[str, object]) -> None:
    _check_bounds(inst, _plan(inst))


def test_zero_budgets_steal_nothing() -> None:
    lengths = np.array([500, 500, 500])
    plan = plan_stealing(
        lengths,
        np.array([0.1, 0.1, 0.1]),
        np.array([0, 1, 0]),
        np.array([0.0, 0.99]),  # floor(0.99) = 0 tokens
        0.0,
        PrefillPredictor(c1=1e-3, c0=0.0),
        SuffixPredictor(s1=1e-3, s0=0.0),
    )
    assert plan.stolen.tolist() == [0, 0, 0]


# --------------------------------------------------------------------------------------------
# Stealing never increases predicted violations
# --------------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(realistic_instances())
def test_stealing_never_increases_violations_realistic(inst: dict[str, object]) -> None:
    stolen = _plan(inst)
    zero = np.zeros(len(stolen), dtype=np.int64)
    assert _violations(inst, stolen) <= _violations(inst, zero)


@settings(max_examples=300, deadline=None)
@given(grid_instances())
def test_stealing_never_increases_violations_grid(inst: dict[str, object]) -> None:
    stolen = _plan(inst)
    zero = np.zeros(len(stolen), dtype=np.int64)
    assert _violations(inst, stolen) <= _violations(inst, zero)


def test_costly_suffix_does_not_create_a_violation() -> None:
    """s1 > c1 and s0 > 0: a barely-schedulable donor must not be pushed past its deadline."""
    prefill = PrefillPredictor(c1=1.0, c0=0.0)
    suffix = SuffixPredictor(s1=3.0, s0=2.0)
    # Request 0: work 10, remaining 12.5, slack 2.5; giving x >= 1 tokens costs it
    # s0 + (s1 - c1) x = 2 + 2x > 2.5, so it can give nothing. Request 1 is 5.5 tokens late.
    inst: dict[str, object] = {
        "lengths": [10, 10],
        "deadlines": [12.5, 14.5],
        "decode_index": [0, 0],
        "budgets": [100.0],
        "now": 0.0,
        "prefill": prefill,
        "suffix": suffix,
        "backlog": 0.0,
    }
    stolen = _plan(inst)
    assert stolen.tolist() == [0, 0]
    assert _violations(inst, stolen) == 1


# --------------------------------------------------------------------------------------------
# Greedy = brute force (paper's exchange argument) on small single-decode instances
# --------------------------------------------------------------------------------------------


@st.composite
def tiny_instances(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(1, 4))
    c1 = draw(st.integers(1, 2))
    c0 = draw(st.integers(c1, c1 + 3))
    now = float(draw(st.integers(0, 5)))
    lengths = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    rel = draw(st.lists(st.integers(-2, 40), min_size=n, max_size=n))
    return {
        "lengths": lengths,
        "deadlines": [now + r for r in rel],
        "decode_index": [0] * n,
        "budgets": [float(draw(st.integers(0, 8)))],
        "now": now,
        "prefill": PrefillPredictor(c1=float(c1), c0=float(c0)),
        "suffix": SuffixPredictor(s1=float(c1), s0=0.0),
        "backlog": float(draw(st.integers(0, 3))),
    }


def _brute_force_min_violations(inst: dict[str, object]) -> int:
    lengths: list[int] = inst["lengths"]  # type: ignore[assignment]
    budget = math.floor(inst["budgets"][0])  # type: ignore[index]
    best = len(lengths)
    for vec in itertools.product(*(range(length + 1) for length in lengths)):
        if sum(vec) > budget:
            continue
        best = min(best, _violations(inst, np.array(vec, dtype=np.int64)))
    return best


@settings(max_examples=80, deadline=None)
@given(tiny_instances())
def test_greedy_equals_brute_force(inst: dict[str, object]) -> None:
    stolen = _plan(inst)
    assert int(stolen.sum()) <= math.floor(inst["budgets"][0])  # type: ignore[index]
    assert _violations(inst, stolen) == _brute_force_min_violations(inst)


def test_greedy_equals_brute_force_worked_case() -> None:
    """Three requests, one token of slack each way: the greedy must pick the earliest donor."""
    inst: dict[str, object] = {
        "lengths": [3, 3, 3],
        "deadlines": [4.0, 6.0, 9.0],
        "decode_index": [0, 0, 0],
        "budgets": [2.0],
        "now": 0.0,
        "prefill": PrefillPredictor(c1=1.0, c0=1.0),
        "suffix": SuffixPredictor(s1=1.0, s0=0.0),
        "backlog": 0.0,
    }
    # Work 4, 8, 12 vs deadlines 4, 6, 9: request 1 is 2 late, request 2 is 3 late. With 2
    # tokens from request 0, request 1 is fixed; request 2 can't be (budget), so 1 violation.
    stolen = _plan(inst)
    assert stolen.tolist() == [2, 0, 0]
    assert _violations(inst, stolen) == 1 == _brute_force_min_violations(inst)


# --------------------------------------------------------------------------------------------
# Eq. (16): the inverse suffix predictor
# --------------------------------------------------------------------------------------------


@st.composite
def suffix_and_budget(draw: st.DrawFn) -> tuple[SuffixPredictor, float, int]:
    s1 = draw(st.floats(1e-6, 1e-2))
    s0 = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.05)))
    s2 = draw(st.one_of(st.just(0.0), st.floats(1e-10, 1e-6)))
    p = SuffixPredictor(s1=s1, s0=s0, s2=s2)
    n = draw(st.integers(0, 50_000))
    frac = draw(st.floats(1e-3, 1.0 - 1e-3))
    lo = p.time(n)
    t = lo + frac * (p.time(n + 1) - lo)
    return p, t, n


@settings(max_examples=500, deadline=None)
@given(suffix_and_budget())
def test_max_tokens_is_largest_fitting_integer(case: tuple[SuffixPredictor, float, int]) -> None:
    p, t, n = case
    x = p.max_tokens(t)
    assert x == n
    assert p.time(x) <= t
    assert p.time(x + 1) > t


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-6, 1e-2), st.floats(0.0, 0.05), st.integers(1, 50_000))
def test_max_tokens_exact_boundary_linear(s1: float, s0: float, n: int) -> None:
    """With s2 = 0 a budget of exactly T_sfx(n) admits n tokens."""
    p = SuffixPredictor(s1=s1, s0=s0)
    assert p.max_tokens(p.time(n)) == n


@pytest.mark.parametrize("n", [1, 7, 128, 1000, 4096, 20_000])
def test_max_tokens_exact_boundary_profile_values(n: int) -> None:
    # The llama-3.1-8b profile's suffix coefficients (in seconds).
    p = SuffixPredictor(s1=7.2e-5, s0=4e-3, s2=1.3e-9)
    assert p.max_tokens(p.time(n)) == n


@pytest.mark.parametrize(
    ("s1", "s0", "s2", "n"),
    [(1.0, 0.0, 1e-9, 1), (1.0, 0.0, 1e-9, 2), (1e-3, 0.0, 1e-12, 5)],
)
def test_max_tokens_exact_boundary_quadratic(s1: float, s0: float, s2: float, n: int) -> None:
    p = SuffixPredictor(s1=s1, s0=s0, s2=s2)
    assert p.time(n) <= p.time(n)  # n itself fits a budget of exactly T_sfx(n) ...
    assert p.max_tokens(p.time(n)) == n  # ... but max_tokens returns n - 1


def test_max_tokens_one_token_threshold_rounding() -> None:
    p = SuffixPredictor(s1=0.2, s0=0.1, s2=0.3)
    t = p.time(1)  # 0.6, while 0.1 + 0.2 + 0.3 == 0.6000000000000001
    assert p.max_tokens(t) == 1


@pytest.mark.parametrize("s2", [0.0, 1e-3])
def test_max_tokens_below_one_token(s2: float) -> None:
    p = SuffixPredictor(s1=0.01, s0=0.005, s2=s2)
    assert p.max_tokens(0.0) == 0
    assert p.max_tokens(-1.0) == 0
    assert p.max_tokens(p.time(1) * (1 - 1e-9)) == 0
    assert p.max_tokens(p.time(3) * (1 + 1e-12)) == 3


# --------------------------------------------------------------------------------------------
# Eqs. (12)-(17): budgets
# --------------------------------------------------------------------------------------------


@given(
    st.floats(0.0, 2.0),
    st.floats(0.01, 1.0),
    st.integers(0, 100_000),
    st.integers(1, 16),
)
def test_steal_budget_gate_and_share(load: float, high: float, max_sfx: int, n_p: int) -> None:
    b = steal_budget(load, max_sfx, n_p, high)
    if load >= high:
        assert b == 0.0
        assert not stealing_allowed(load, high)
    else:
        assert b == pytest.approx(max_sfx / n_p)
        assert stealing_allowed(load, high)


def test_steal_budget_boundary_and_no_prefill() -> None:
    assert steal_budget(0.6, 1000, 2, 0.6) == 0.0  # at the threshold: no stealing (eq. 17)
    assert steal_budget(0.59999, 1000, 4, 0.6) == 250.0
    assert steal_budget(0.0, 1000, 0, 0.6) == 0.0


@given(
    st.floats(-1.0, 0.0),
    st.floats(0.1, 3.0),
    st.floats(1e-6, 1e-3),
    st.floats(0.0, 0.01),
)
def test_max_admissible_suffix_zero_for_non_positive_slack(
    slack: float, eta: float, s1: float, s0: float
) -> None:
    assert max_admissible_suffix(slack, eta, SuffixPredictor(s1=s1, s0=s0)) == 0


@given(st.floats(1e-4, 1.0), st.floats(0.1, 3.0), st.floats(1e-6, 1e-3), st.floats(0.0, 0.01))
def test_max_admissible_suffix_inverts_eta_slack(
    slack: float, eta: float, s1: float, s0: float
) -> None:
    p = SuffixPredictor(s1=s1, s0=s0)
    x = max_admissible_suffix(slack, eta, p)
    budget = eta * slack
    assume(abs(p.time(x + 1) - budget) > 1e-12 and abs(p.time(max(x, 1)) - budget) > 1e-12)
    assert x == p.max_tokens(budget)
    if x > 0:
        assert p.time(x) <= eta * slack
    assert p.time(x + 1) > eta * slack


def test_max_admissible_suffix_hand_example() -> None:
    # eta * slack = 1.25 * 0.04 = 0.05 s; (0.05 - 0.002) / 1e-4 = 480 tokens.
    p = SuffixPredictor(s1=1e-4, s0=0.002)
    assert max_admissible_suffix(0.04, 1.25, p) == 480


def test_pending_suffixes_take_their_fixed_cost_from_the_allowance() -> None:
    # An idle decode worker (iteration 20 ms): eta * slack = 0.1 s of extend per iteration.
    # Suffixes of 20 tokens cost 12.2 ms each, nearly all of it the fixed s0: a queue of them
    # fills the allowance of SUFFIX_QUEUE_ITERATIONS iterations long before their tokens would.
    decode = DecodeIterPredictor(a_c=0.0, a_n=0.0, a_0=0.02)
    suffix = SuffixPredictor(s1=1e-5, s0=0.012)
    cfg = FluidTokenConfig()

    def budget(pending: list[int]) -> float:
        return advertised_budget(0.1, decode, suffix, 0, 0, [(t, 0) for t in pending], 0.0, 1, cfg)

    full = budget([])
    assert full == max_admissible_suffix(0.08, cfg.eta, suffix)
    # As many small suffixes as fit in the iterations' allowance leave nothing.
    fits = int(cfg.eta * 0.08 * SUFFIX_QUEUE_ITERATIONS / suffix.time(20))
    assert budget([20] * (fits + 1)) == 0.0
    assert 20 * (fits + 1) < full / 10
    # The same tokens as one suffix pay s0 once and leave room.
    assert budget([20 * (fits + 1)]) > 0.0
    # Room shrinks with each pending suffix.
    assert budget([20]) < full and budget([20, 20]) < budget([20])


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-3, 0.08),
    st.floats(1e-6, 1e-4),
    st.floats(0.0, 0.02),
    st.integers(1, 8),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_whole_budget_commits_stay_within_the_allowance(
    a0: float, s1: float, s0: float, n_prefill: int, takes: list[float]
) -> None:
    """Any number of prefill workers, each committing any part of the budget it reads after
    the commits before it: the pending suffixes never take more than the allowance of
    SUFFIX_QUEUE_ITERATIONS iterations, whatever |P| (the advertisement does not depend on
    it), while eq. (17)'s split advertises 1/|P| of the whole."""
    decode = DecodeIterPredictor(a_c=0.0, a_n=0.0, a_0=a0)
    suffix = SuffixPredictor(s1=s1, s0=s0)
    cfg = FluidTokenConfig()
    slack = 0.1 - a0

    def budget(pending: list[int], n: int, c: FluidTokenConfig = cfg) -> float:
        return advertised_budget(0.1, decode, suffix, 0, 0, [(t, 0) for t in pending], 0.0, n, c)

    whole = budget([], 1)
    assert budget([], n_prefill) == whole
    split = budget([], n_prefill, FluidTokenConfig(split_budget=True))
    assert split == pytest.approx(whole / n_prefill)
    pending: list[int] = []
    for take in takes:
        tokens = int(take * budget(pending, n_prefill))
        if tokens > 0:
            pending.append(tokens)
        spent = sum(suffix.time(x) for x in pending)
        assert spent <= cfg.eta * slack * SUFFIX_QUEUE_ITERATIONS + 1e-9


def test_donor_cap_with_cheap_suffix_and_large_s0() -> None:
    prefill = PrefillPredictor(c1=1.0, c0=0.0)
    suffix = SuffixPredictor(s1=0.5, s0=2.0)  # cheaper per token than prefill, fixed cost 2
    inst: dict[str, object] = {
        "lengths": [10, 10],
        "deadlines": [11.5, 15.0],  # request 0: slack 1.5 < s0; request 1: 5 tokens late
        "decode_index": [0, 0],
        "budgets": [100.0],
        "now": 0.0,
        "prefill": prefill,
        "suffix": suffix,
        "backlog": 0.0,
    }
    # Stealing 5 tokens from request 0 keeps it schedulable (prefix work 5 against
    # 11.5 - T_sfx(5) = 7: PPI_0 = 5/7) and fixes request 1 (PPI_1 = 10/10): zero violations.
    assert _violations(inst, np.array([5, 0])) == 0
    assert _violations(inst, _plan(inst)) == 0


# --------------------------------------------------------------------------------------------
# The scheduler commits only the head's share: head_only must agree with the full plan
# --------------------------------------------------------------------------------------------


def _plan_head_only(inst: dict[str, object]) -> np.ndarray:
    return _plan(inst, head_only=True)


@settings(max_examples=300, deadline=None)
@given(st.one_of(grid_instances(), realistic_instances()))
def test_head_only_matches_full_plan_head(inst: dict[str, object]) -> None:
    full = _plan(inst)
    head = _plan_head_only(inst)
    assert head.shape == full.shape
    assert int(head[0]) == int(full[0])
    assert not head[1:].any()


@settings(max_examples=400, deadline=None)
@given(
    length=st.integers(1, 5000),
    slack=st.floats(-1.0, 5.0, allow_nan=False),
    c1=st.floats(1e-6, 1e-3),
    s1=st.floats(1e-6, 1e-3),
    s0=st.floats(0.0, 0.05),
    s2=st.sampled_from([0.0, 1e-9, 1.3e-9, 1e-7]),
    sp=st.sampled_from([0.0, 1e-9, 2.6e-9, 3.4e-9, 1e-7]),
)
def test_head_cap_scalar_equals_array_form(
    length: int, slack: float, c1: float, s1: float, s0: float, s2: float, sp: float
) -> None:
    """The scheduler's scalar head cap and the planner's array form are the same rule."""
    pre = PrefillPredictor(c1=c1, c0=0.01)
    sfx = SuffixPredictor(s1=s1, s0=s0, s2=s2, sp=sp)
    arr = _donor_caps(np.array([float(length)]), np.array([slack]), np.array([False]), pre, sfx)[0]
    assert _head_cap(float(length), slack, pre, sfx) == arr


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(1, 600),
    allowance=st.floats(-0.01, 0.2, allow_nan=False),
    credit=st.sampled_from([0.0, 1e-5, 1e-4]),
    s1=st.floats(1e-6, 1e-3),
    s0=st.floats(0.0, 0.02),
    s2=st.sampled_from([0.0, 1e-9, 1e-7, 1e-6]),
    sp=st.sampled_from([0.0, 1e-9, 1e-7, 1e-6, 1e-5]),
)
def test_suffix_caps_are_the_longest_suffix_every_shorter_one_of_which_fits(
    length: int, allowance: float, credit: float, s1: float, s0: float, s2: float, sp: float
) -> None:
    """Against brute force, convex and concave alike (sp > s2: the prefix a suffix extends
    shrinks as it takes more of the prompt): the cap is the largest x with
    T_sfx(y | L - y) - credit y <= allowance for every 1 <= y <= x."""
    sfx = SuffixPredictor(s1=s1, s0=s0, s2=s2, sp=sp)

    def longest(tolerance: float) -> int:
        fits = 0
        for y in range(1, length + 1):
            if sfx.of_prompt(y, length) - credit * y > allowance + tolerance:
                break
            fits = y
        return fits

    # Exactly at the boundary the cap's quadratic and ``time`` round differently.
    got = _suffix_caps(np.array([float(length)]), np.array([allowance]), credit, sfx)[0]
    assert longest(-1e-12) <= got <= longest(1e-12)
    assert _suffix_cap(float(length), allowance, credit, sfx) == got


def test_a_long_prompt_hands_its_decode_worker_fewer_tokens_for_one_budget() -> None:
    """Issue #14: FluidToken never steals when the suffix's extend cost, which grows with the
    context it extends, passes the decode worker's TPOT slack. One budget (the tokens an
    extend of no prefix fits in the slack), one late queue behind the head: the head of a
    16K-token prompt gives fewer tokens than the head of a 2K-token prompt, and each within
    the extend time the budget stands for."""
    profile = resolve_profile("llama-3.1-8b", "h200", None)
    pre, sfx = profile.prefill_predictor(), profile.suffix_predictor()
    budget = float(max_admissible_suffix(0.04, 1.25, sfx))
    stolen = {}
    for head in (2048, 16384):
        lengths = np.array([head, 8000, 8000, 8000], dtype=np.int64)
        deadlines = np.array([50.0, 0.2, 0.2, 0.2])  # the head on time, the rest late
        plan = plan_stealing(
            lengths, deadlines, np.zeros(4, dtype=np.int64), np.array([budget]), 0.0, pre, sfx
        )
        x = int(plan.stolen[0])
        assert 0 < x <= budget
        assert sfx.of_prompt(x, head) <= sfx.time(budget) < sfx.of_prompt(x + 1, head)
        head_only = plan_stealing(
            lengths, deadlines, np.zeros(4, dtype=np.int64), np.array([budget]), 0.0, pre, sfx,
            head_only=True,
        )  # fmt: skip
        assert int(head_only.stolen[0]) == x
        stolen[head] = x
    assert stolen[16384] < stolen[2048] / 2
    # The context-blind predictor of before would have taken the whole budget from either.
    blind = SuffixPredictor(s1=sfx.s1, s0=sfx.s0, s2=sfx.s2)
    assert sfx.of_prompt(int(budget), 16384) > 2 * blind.time(budget)


@settings(max_examples=60, deadline=None)
@given(
    gap=st.integers(1, 400),
    prompt=st.integers(1000, 16000),
    out=st.integers(16, 4096),
    n=st.integers(1, 60),
)
def test_kv_intake_forecast_is_littles_law_over_half_a_hold(
    gap: int, prompt: int, out: int, n: int
) -> None:
    intake = KvIntake()
    for i in range(n):
        intake.add(i * gap, prompt, out, 4096)
    now = (n - 1) * gap
    f = intake.forecast(now, 400_000)
    hold = min(out, 4096)
    window = max(1.0, hold / 2)
    kept = sum(1 for i in range(n) if i * gap >= now - window)
    assert f == kv_occupancy_forecast(kept * (prompt + hold), window, hold, 400_000)
    # Arrivals twice as dense forecast at least as much KV held.
    dense = KvIntake()
    for i in range(2 * n):
        dense.add(i * gap // 2, prompt, out, 4096)
    assert dense.forecast((2 * n - 1) * gap // 2, 400_000) >= f


def test_a_decode_worker_whose_intake_will_fill_its_kv_advertises_no_budget() -> None:
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    w = Worker.create("d0", Role.DECODE, profile, SLO(2.0, 0.1), FluidTokenConfig())
    d = w.decode
    assert d.steal_budget(1) > 0
    # Forty long generations handed over at once: KV and TPOT have room now, but requests
    # coming at this rate would hold more KV than the worker has before these streams end.
    for rid in range(40):
        d.add(Request(rid, 0.0, 4000, 2000))
    assert not d.prealloc and d.dpi_adm() < 0.6
    assert d.intake.forecast(d.iteration, d.kv_capacity) >= 1.0
    assert d.steal_budget(1) == 0.0


_STREAM = st.tuples(st.floats(0.0, 0.5), st.integers(1, 40), st.integers(2, 60)).filter(
    lambda x: x[1] <= x[2]
)


@given(
    st.lists(_STREAM, min_size=1, max_size=8),
    st.floats(0.005, 0.04),
    st.floats(0.02, 0.2),
    st.floats(1.0, 1.5),
)
def test_a_suffix_within_the_stream_room_keeps_every_stream_within_tpot(
    streams: list[tuple[float, int, int]], t: float, slo: float, stretch: float
) -> None:
    """The iteration that spends the room, then iterations of ``t`` (stretched as the worker's
    measured ones) until each stream's last token: no stream's TPOT passes the target, and the
    tightest one is at it; a second more puts that one past it. Streams that miss even with
    no suffix are not protected (nothing the iteration does saves them)."""
    room = stream_tpot_room(slo, t, streams, stretch)

    def over(extra: float, elapsed: float, out: int, n: int) -> float:
        return (elapsed + stretch * (extra + max(1, n - out) * t)) / (n - 1) - slo

    # A stream at its edge to within rounding may be counted (no room) or given up: hypothesis
    # found one whose budget the room's arithmetic put a rounding error below its need.
    at_edge = any(abs(over(0.0, *s)) <= 1e-9 for s in streams)
    savable = [s for s in streams if over(0.0, *s) < -1e-9]
    if not savable:
        assert room == math.inf or (at_edge and room <= 1e-9)
        return
    if at_edge and room <= 1e-9:
        return
    worst = max(over(room, *s) for s in savable)
    assert worst == pytest.approx(0.0, abs=1e-9)
    assert max(over(room + 1e-3, *s) for s in savable) > 0


@given(
    st.lists(_STREAM, min_size=1, max_size=8),
    st.floats(0.005, 0.04),
    st.floats(0.5, 1.0),
    st.floats(0.02, 0.2),
)
def test_streams_the_fastest_iterations_could_save_are_kept_with_no_room_left(
    streams: list[tuple[float, int, int]], t: float, fast: float, slo: float
) -> None:
    """With the fastest iteration seen, a stream is given up only if it misses even at that
    pace; one that misses only at the typical pace leaves no room (any suffix waits), and
    the room of every other stream is as without it."""
    fastest = fast * t
    room = stream_tpot_room(slo, t, streams, fastest_s=fastest)

    def left(pace: float, elapsed: float, out: int, n: int) -> float:
        return slo * (n - 1) - elapsed - max(1, n - out) * pace

    kept = [s for s in streams if left(fastest, *s) >= 0]
    assert room == min((max(0.0, left(t, *s)) for s in kept), default=math.inf)
    assert room <= stream_tpot_room(slo, t, streams)
    assert stream_tpot_room(slo, t, streams, fastest_s=t) == stream_tpot_room(slo, t, streams)


@given(
    st.lists(_STREAM, min_size=1, max_size=8),
    st.floats(0.005, 0.04),
    st.floats(0.02, 0.2),
    st.lists(st.tuples(st.floats(0.0, 0.01), st.integers(0, 400)), max_size=3),
)
def test_a_joining_stream_takes_its_slower_steps_out_of_every_stream_it_shares_them_with(
    streams: list[tuple[float, int, int]],
    t: float,
    slo: float,
    joining: list[tuple[float, int]],
) -> None:
    """Each request an extend adds slows the steps it decodes in: a stream loses that for each
    of its own remaining steps the request shares, no room goes negative, and the streams
    given up without it are given up with it (what they would miss at is unchanged)."""
    room = stream_tpot_room(slo, t, streams, joining=joining)

    def left(elapsed: float, out: int, n: int) -> float:
        return slo * (n - 1) - elapsed - max(1, n - out) * t

    def slowed(out: int, n: int) -> float:
        return sum(sec * min(max(1, n - out), k) for sec, k in joining)

    kept = [s for s in streams if s[2] > 1 and left(*s) >= 0]
    want = min((max(0.0, left(*s) - slowed(*s[1:])) for s in kept), default=math.inf)
    assert room == pytest.approx(want, abs=1e-12)
    assert room <= stream_tpot_room(slo, t, streams)
    assert stream_tpot_room(slo, t, streams, joining=[(0.01, 0)]) == stream_tpot_room(
        slo, t, streams
    )


def test_streams_without_a_tpot_leave_unbounded_room() -> None:
    assert stream_tpot_room(0.05, 0.02, []) == math.inf
    assert stream_tpot_room(0.05, 0.02, [(10.0, 1, 1)]) == math.inf


def test_iteration_error_stretch_is_the_measured_mean_ratio() -> None:
    exact = IterationError()
    for _ in range(50):
        exact.add(0.02, 0.02)
    assert exact.stretch == pytest.approx(1.0)
    slow = IterationError()
    for _ in range(200):
        slow.add(0.02, 0.03)  # an engine half as fast again as its profile
    assert slow.stretch == pytest.approx(1.5)
    noisy = IterationError()
    rng = np.random.default_rng(0)
    for r in np.exp(rng.normal(0.0, 0.1, size=4000) - 0.005):  # mean-one noise
        noisy.add(0.02, 0.02 * float(r))
    assert noisy.stretch == pytest.approx(1.0, abs=0.05)
    fast = IterationError()
    fast.add(0.02, 0.01)
    assert fast.stretch == 1.0  # never below the prediction
    assert IterationError().stretch == 1.0  # nothing measured: the prediction as it is
