"""Hand-computed checks of the pressure signals: PPI (eqs. 1-5, 9-11), eq. 19, DPI (eqs. 6-8)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidpd.core.predictors import DecodeIterPredictor, PrefillPredictor, SuffixPredictor
from fluidpd.core.signals import (
    DEFAULT_EPS,
    allocatable_kv,
    cumulative_prefill_work,
    dpi_adm,
    dpi_load,
    prefix_deadlines,
    queue_ppi,
    request_ppi,
    steal_ppi,
    token_deficits,
    ttft_deadlines,
)

# T_pre(L) = 0.01 L + 0.1 s; three queued requests of 100, 200 and 50 tokens take 1.1, 2.1 and
# 0.6 s, so they finish 1.1, 3.2 and 3.8 s after the queue starts. Arrivals 0, 1, 2 with
# S_TTFT = 3 s give deadlines 3, 4, 5.
PREFILL = PrefillPredictor(c1=0.01, c0=0.1)
SUFFIX = SuffixPredictor(s1=0.02, s0=0.05)
LENGTHS = np.array([100, 200, 50], dtype=np.int64)
ARRIVALS = np.array([0.0, 1.0, 2.0])
SLO = 3.0


def test_eq1_deadlines() -> None:
    np.testing.assert_allclose(ttft_deadlines(ARRIVALS, SLO), [3.0, 4.0, 5.0])


def test_eq2_prefill_predictor() -> None:
    assert PREFILL.time(100) == pytest.approx(1.1)
    np.testing.assert_allclose(PREFILL.time(np.array([0.0, 200.0])), [0.1, 2.1])
    quad = PrefillPredictor(c1=0.01, c0=0.1, c2=1e-4)
    assert quad.time(100) == pytest.approx(1e-4 * 100**2 + 1.1)


def test_cumulative_work_and_backlog_offset() -> None:
    np.testing.assert_allclose(cumulative_prefill_work(LENGTHS, PREFILL), [1.1, 3.2, 3.8])
    np.testing.assert_allclose(
        cumulative_prefill_work(LENGTHS, PREFILL, backlog_s=0.5), [1.6, 3.7, 4.3]
    )


def test_eq4_request_ppi() -> None:
    work = cumulative_prefill_work(LENGTHS, PREFILL)
    deadlines = ttft_deadlines(ARRIVALS, SLO)
    # now = 1: remaining budgets 2, 3, 4.
    np.testing.assert_allclose(request_ppi(work, deadlines, 1.0), [1.1 / 2, 3.2 / 3, 3.8 / 4])


def test_eq4_epsilon_clamp_for_expired_deadlines() -> None:
    work = cumulative_prefill_work(LENGTHS, PREFILL)
    deadlines = ttft_deadlines(ARRIVALS, SLO)
    # now = 5: remaining -2, -1, 0 -> every denominator is epsilon.
    ppi = request_ppi(work, deadlines, 5.0)
    np.testing.assert_allclose(ppi, work / DEFAULT_EPS)
    assert np.all(ppi > 1)
    # A custom epsilon is honoured, and a remaining budget just above it is used as is.
    np.testing.assert_allclose(request_ppi(work, deadlines, 5.0, eps=0.5), work / 0.5)
    np.testing.assert_allclose(
        request_ppi(np.array([1.0]), np.array([5.75]), 5.0, eps=0.5), [1.0 / 0.75]
    )


def test_eq3_schedulable_iff_ppi_at_most_one() -> None:
    work = np.array([2.0, 3.0])
    # Request 0 exactly on time (PPI = 1 -> schedulable), request 1 late.
    ppi = request_ppi(work, np.array([2.0, 2.5]), 0.0)
    np.testing.assert_allclose(ppi, [1.0, 1.2])
    assert ppi[0] <= 1 < ppi[1]


def test_eq5_queue_ppi() -> None:
    assert queue_ppi(LENGTHS, ARRIVALS, 1.0, SLO, PREFILL) == pytest.approx(3.2 / 3)
    # Backlog offset: the running batch has 0.5 s left.
    assert queue_ppi(LENGTHS, ARRIVALS, 1.0, SLO, PREFILL, backlog_s=0.5) == pytest.approx(3.7 / 3)
    # Early enough, everyone fits: max(1.1 / 13, 3.2 / 14, 3.8 / 15).
    assert queue_ppi(LENGTHS, ARRIVALS, -10.0, SLO, PREFILL) == pytest.approx(3.8 / 15)
    # An empty queue has no pressure, even with a backlog.
    empty = np.array([], dtype=np.int64)
    assert queue_ppi(empty, np.array([]), 1.0, SLO, PREFILL, backlog_s=5.0) == 0.0


def test_eq9_prefix_deadlines() -> None:
    deadlines = np.array([3.0, 4.0, 5.0])
    # T_sfx(50) = 0.02 * 50 + 0.05 = 1.05; T_sfx(0) = 0 (no suffix, no fixed cost).
    np.testing.assert_allclose(
        prefix_deadlines(deadlines, LENGTHS, np.array([50, 0, 0]), SUFFIX), [1.95, 4.0, 5.0]
    )
    np.testing.assert_allclose(
        prefix_deadlines(deadlines, LENGTHS, np.array([0, 0, 0]), SUFFIX), deadlines
    )


def test_eq10_11_steal_ppi() -> None:
    deadlines = np.array([3.0, 4.0, 5.0])
    stolen = np.array([50, 0, 0])
    # Prefix lengths 50, 200, 50 -> work 0.6, 2.7, 3.3; prefix deadlines 1.95, 4, 5; now 1.
    ppi = steal_ppi(LENGTHS, stolen, deadlines, 1.0, PREFILL, SUFFIX)
    np.testing.assert_allclose(ppi, [0.6 / 0.95, 2.7 / 3.0, 3.3 / 4.0])
    # Stealing 50 tokens of request 0 fixes request 1, which was late without stealing.
    base = steal_ppi(LENGTHS, np.zeros(3, dtype=np.int64), deadlines, 1.0, PREFILL, SUFFIX)
    np.testing.assert_allclose(base, [1.1 / 2, 3.2 / 3, 3.8 / 4])
    # Backlog and epsilon behave as in eq. (4).
    ppi_b = steal_ppi(LENGTHS, stolen, deadlines, 1.0, PREFILL, SUFFIX, backlog_s=0.25)
    np.testing.assert_allclose(ppi_b, [0.85 / 0.95, 2.95 / 3.0, 3.55 / 4.0])
    late = steal_ppi(LENGTHS, stolen, deadlines, 4.5, PREFILL, SUFFIX, eps=0.01)
    np.testing.assert_allclose(late, [0.6 / 0.01, 2.7 / 0.01, 3.3 / 0.5])


def test_eq19_token_deficits() -> None:
    work = cumulative_prefill_work(LENGTHS, PREFILL)
    deadlines = np.array([3.0, 4.0, 5.0])
    # (1.1 - 2, 3.2 - 3, 3.8 - 4) / 0.01
    np.testing.assert_allclose(
        token_deficits(work, deadlines, 1.0, PREFILL), [-90.0, 20.0, -20.0], atol=1e-9
    )
    # Under the stealing decision of the eq. (11) test: (0.6 - 0.95, 2.7 - 3, 3.3 - 4) / 0.01.
    pwork = cumulative_prefill_work(LENGTHS - np.array([50, 0, 0]), PREFILL)
    pddl = prefix_deadlines(deadlines, LENGTHS, np.array([50, 0, 0]), SUFFIX)
    np.testing.assert_allclose(
        token_deficits(pwork, pddl, 1.0, PREFILL), [-35.0, -30.0, -70.0], atol=1e-9
    )


def test_eq19_deficit_closes_exactly_with_affine_predictor() -> None:
    """Removing X_i tokens from ahead of i (c2 = 0) makes it exactly schedulable."""
    prefill = PrefillPredictor(c1=0.5, c0=1.0)
    lengths = np.array([10, 10, 10])
    deadlines = np.array([100.0, 100.0, 14.0])
    work = cumulative_prefill_work(lengths, prefill)  # 6, 12, 18
    x = token_deficits(work, deadlines, 0.0, prefill)
    assert x[2] == pytest.approx(8.0)  # (18 - 14) / 0.5
    fixed = cumulative_prefill_work(lengths - np.array([8, 0, 0]), prefill)
    assert request_ppi(fixed, deadlines, 0.0)[2] == pytest.approx(1.0)


def test_eq6_allocatable() -> None:
    assert allocatable_kv(1000, 300, 200) == 500
    assert allocatable_kv(1000, 0, 0) == 1000
    assert allocatable_kv(1000, 600, 400) == 0


def test_eq7_dpi_load() -> None:
    assert dpi_load(300, 1000, 10, 40) == pytest.approx(0.3)  # KV term dominates
    assert dpi_load(300, 1000, 20, 40) == pytest.approx(0.5)  # batch term dominates
    assert dpi_load(0, 1000, 0, 40) == 0.0
    # N_TPOT = 0: any running request means infinite load; an idle worker only its KV.
    assert dpi_load(100, 1000, 1, 0) == math.inf
    assert dpi_load(100, 1000, 0, 0) == pytest.approx(0.1)


def test_eq8_dpi_adm() -> None:
    assert dpi_adm(500, 1000) == pytest.approx(0.5)
    assert dpi_adm(1000, 1000) == 0.0
    assert dpi_adm(0, 1000) == 1.0
    # DPI_adm >= KV part of DPI_load: reserved KV counts for admission, not for load.
    cap, active, reserved = 1000, 300, 200
    assert dpi_adm(allocatable_kv(cap, active, reserved), cap) >= active / cap


def test_eq13_decode_iteration() -> None:
    d = DecodeIterPredictor(a_c=1e-6, a_n=1e-4, a_0=0.01)
    assert d.time(10, 5000) == pytest.approx(1e-6 * 5000 + 1e-4 * 10 + 0.01)
    assert d.time(0, 0) == pytest.approx(0.01)


def test_n_tpot_hand_example() -> None:
    # Per request 1e-6 * 2000 + 1e-4 = 2.1 ms; room 50 - 10 = 40 ms -> 19 requests.
    d = DecodeIterPredictor(a_c=1e-6, a_n=1e-4, a_0=0.01)
    assert d.max_batch(0.05, 2000.0) == 19
    assert d.time(19, 19 * 2000) <= 0.05 < d.time(20, 20 * 2000)
    assert d.max_batch(0.01, 2000.0) == 0  # no room at all
    assert d.max_batch(0.005, 2000.0) == 0
    free = DecodeIterPredictor(a_c=0.0, a_n=0.0, a_0=0.01)
    assert free.max_batch(0.05, 2000.0) >= 1 << 20  # unbounded by TPOT


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 1000),  # a_c in units of 2^-30 s/token
    st.integers(0, 1000),  # a_n in units of 2^-20 s
    st.integers(1, 200),  # a_0 in units of 2^-10 s
    st.integers(1, 400),  # S_TPOT in units of 2^-10 s
    st.integers(0, 20_000),  # mean context (tokens)
)
def test_n_tpot_matches_brute_force(ac: int, an: int, a0: int, slo: int, ctx: int) -> None:
    """N_TPOT is the largest N with T_iter(N, N * ctx) <= S_TPOT (dyadic values: exact)."""
    d = DecodeIterPredictor(a_c=ac / 2**30, a_n=an / 2**20, a_0=a0 / 2**10)
    tpot = slo / 2**10
    per = Fraction(ac, 2**30) * ctx + Fraction(an, 2**20)
    room = Fraction(slo - a0, 2**10)
    got = d.max_batch(tpot, float(ctx))
    if room <= 0:
        assert got == 0
        return
    if per == 0:
        assert got >= 1 << 20
        return
    n = 0
    # Brute force upwards from a lower bound (the loop is short by construction).
    n = max(0, math.floor(room / per) - 2)
    while (n + 1) * per <= room:
        n += 1
    assert got == n
    if n > 0:
        assert d.time(n, n * ctx) <= tpot + 1e-12


def test_suffix_predictor_zero_tokens_costs_nothing() -> None:
    assert SUFFIX.time(0) == 0.0
    assert SUFFIX.time(-3) == 0.0
    assert SUFFIX.time(1) == pytest.approx(0.07)


@pytest.mark.parametrize(
    "kwargs",
    [{"c1": 0.0, "c0": 0.0}, {"c1": 1.0, "c0": -1.0}, {"c1": 1.0, "c0": 0.0, "c2": -1.0}],
)
def test_prefill_predictor_rejects_unphysical(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PrefillPredictor(**kwargs)


def test_decode_predictor_rejects_unphysical() -> None:
    with pytest.raises(ValueError):
        DecodeIterPredictor(a_c=0.0, a_n=0.0, a_0=0.0)
    with pytest.raises(ValueError):
        SuffixPredictor(s1=0.0, s0=0.0)
