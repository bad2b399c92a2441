"""FluidToken: the decode-side stealing budget (eqs. 12-17) and Algorithm 1.

The decode side computes and advertises a per-prefill-worker budget in suffix tokens; each
prefill worker runs Algorithm 1 locally over its queue at every scheduling iteration and gets a
stolen-token count (beta_i * L_i) per queued request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fluidpd.core.predictors import (
    DecodeIterPredictor,
    FloatArray,
    PrefillPredictor,
    SuffixPredictor,
)
from fluidpd.core.signals import (
    DEFAULT_EPS,
    IntArray,
    cumulative_prefill_work,
    request_ppi,
    token_deficits,
)

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class FluidTokenConfig:
    enabled: bool = True
    #: Multiplier on the per-iteration TPOT slack (eq. 15); the paper found 1.25 best.
    eta: float = 1.25
    #: DPI_load^high of eq. (12): no stealing onto a decode worker loaded at or above it.
    dpi_load_high: float = 0.6
    eps: float = DEFAULT_EPS

    def __post_init__(self) -> None:
        if self.eta <= 0:
            raise ValueError("eta must be positive")
        if not 0 < self.dpi_load_high <= 1:
            raise ValueError("dpi_load_high must be in (0, 1]")


def tpot_slack(tpot_slo: float, decode: DecodeIterPredictor, batch: int, context: int) -> float:
    """Delta_d^TPOT = S_TPOT - T_iter(N_d^active, C_d^active), eq. (14)."""
    return tpot_slo - decode.time(batch, context)


def max_admissible_suffix(slack_s: float, eta: float, suffix: SuffixPredictor) -> int:
    """L_d,max^sfx,TPOT = T_sfx^-1(eta * Delta_d^TPOT), eqs. (15)-(16)."""
    if slack_s <= 0:
        return 0
    return suffix.max_tokens(eta * slack_s)


def stealing_allowed(dpi_load_d: float, dpi_load_high: float) -> bool:
    """The load gate DPI_d,load < DPI_load^high, eq. (12)."""
    return dpi_load_d < dpi_load_high


def steal_budget(
    dpi_load_d: float, max_suffix_tokens: int, n_prefill: int, dpi_load_high: float
) -> float:
    """B_d^steal, eq. (17): 0 when the load gate fails, else L_max / |P|."""
    if not stealing_allowed(dpi_load_d, dpi_load_high) or n_prefill <= 0:
        return 0.0
    return max_suffix_tokens / n_prefill


@dataclass(frozen=True, slots=True)
class StealPlan:
    """Algorithm 1's output for one queue."""

    #: Tokens stolen from each queued request (beta_i = stolen_i / L_i).
    stolen: IntArray
    #: Queue PPI before stealing, eq. (5), as a by-product.
    ppi: float

    def betas(self, lengths: IntArray) -> FloatArray:
        return np.where(lengths > 0, self.stolen / np.maximum(lengths, 1), 0.0)


def _donor_caps(
    lengths: IntArray,
    slack: FloatArray,
    violating: BoolArray,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
) -> IntArray:
    """Most tokens each request can give without itself turning TTFT-unschedulable.

    Donating x tokens shortens a request's prefix work by at least c1 x but moves its own
    deadline earlier by T_sfx(x) (eq. 9). A request already predicted to miss its deadline
    can give everything. This guard is our addition to Algorithm 1's eligibility rule; it is
    what makes "stealing never increases predicted violations" hold when the suffix predictor
    is costlier per token than the prefill predictor. With s1 <= c1 and s0 = 0 it never binds.
    """
    a = suffix.s2
    b = suffix.s1 - prefill.c1
    c = suffix.s0 - slack  # <= 0 where at least one token fits
    with np.errstate(invalid="ignore", divide="ignore"):
        if a > 0:
            xmax = (-b + np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
        elif b > 0:
            xmax = -c / b
        else:
            xmax = np.full(len(lengths), np.inf)
    fits = np.minimum(np.floor(xmax - 1e-6), lengths)
    caps = np.where(violating, lengths, np.where(c <= 0, np.maximum(fits, 0), 0))
    return caps.astype(np.int64)


def plan_stealing(
    lengths: IntArray,
    deadlines: FloatArray,
    decode_index: IntArray,
    budgets: FloatArray,
    now: float,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
    backlog_s: float = 0.0,
    eps: float = DEFAULT_EPS,
) -> StealPlan:
    """Algorithm 1: greedy earliest-eligible-first stealing ratios for one prefill queue.

    ``lengths``/``deadlines``/``decode_index`` describe the queue in scheduling order
    (``deadlines`` from eq. 1, ``decode_index`` points into ``budgets``, the per-prefill-worker
    budgets B_d^steal advertised by the paired decode workers, eq. 17).

    The loop of Algorithm 1 is evaluated in closed form: every recipient i draws its deficit
    X_i (eq. 19, in whole tokens) from the earliest donors j < i that still have tokens and
    whose decode worker still has budget, so after processing i the donors are filled in queue
    order up to a total T_i = max(T_{i-1}, min(X_i^0, A_i)), where X_i^0 is i's deficit with no
    stealing and A_i the tokens the donors ahead of i can give within their budgets. The result
    equals the loop's for the affine predictor (c2 = 0) and steals slightly more than needed
    when c2 > 0 (each stolen token then saves more than c1).
    """
    n = len(lengths)
    zeros = np.zeros(n, dtype=np.int64)
    if n == 0:
        return StealPlan(zeros, 0.0)
    work = cumulative_prefill_work(lengths, prefill, backlog_s)
    ppi = float(request_ppi(work, deadlines, now, eps).max())
    if ppi <= 1.0:
        return StealPlan(zeros, ppi)
    need = np.ceil(token_deficits(work, deadlines, now, prefill) - 1e-9)
    violating = need > 0
    budget_tokens = np.floor(np.maximum(budgets, 0.0)).astype(np.int64)
    if not violating.any() or budget_tokens.max(initial=0) <= 0:
        return StealPlan(zeros, ppi)

    caps = _donor_caps(lengths, (deadlines - now) - work, violating, prefill, suffix)

    # Per decode worker, cap the donors' cumulative tokens by its budget, in queue order.
    order = np.argsort(decode_index, kind="stable")
    sorted_caps = caps[order]
    sorted_d = decode_index[order]
    cum = np.cumsum(sorted_caps)
    starts = np.flatnonzero(np.r_[True, sorted_d[1:] != sorted_d[:-1]])
    group_sizes = np.diff(np.r_[starts, n])
    before_group = np.repeat(cum[starts] - sorted_caps[starts], group_sizes)
    capped = np.minimum(cum - before_group, budget_tokens[sorted_d])
    previous = np.r_[0, capped[:-1]]
    previous[starts] = 0
    effective = np.empty(n, dtype=np.int64)
    effective[order] = capped - previous

    ahead = np.cumsum(effective) - effective  # A_i: tokens available from donors j < i
    total = int(np.max(np.where(violating, np.minimum(need, ahead), 0)))
    if total <= 0:
        return StealPlan(zeros, ppi)
    stolen = np.clip(total - ahead, 0, effective).astype(np.int64)
    return StealPlan(stolen, ppi)
