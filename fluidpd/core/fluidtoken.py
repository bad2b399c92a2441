"""FluidToken: the decode-side stealing budget (eqs. 12-17) and Algorithm 1.

The decode side computes and advertises a per-prefill-worker budget in suffix tokens; each
prefill worker runs Algorithm 1 locally over its queue at every scheduling iteration and gets a
stolen-token count (beta_i * L_i) per queued request.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

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
    kv_commitment,
    request_ppi,
    token_deficits,
)

BoolArray = npt.NDArray[np.bool_]


#: Decode iterations' worth of eq. (15) allowance that committed, not yet run, suffixes may
#: fill: one running and one waiting. A decode worker then always has the next iteration's
#: suffix at hand (prefill workers commit once per their own iteration, which can outlast a
#: decode iteration), and a stolen suffix waits at most one iteration before it runs.
SUFFIX_QUEUE_ITERATIONS = 2


@dataclass(frozen=True, slots=True)
class FluidTokenConfig:
    enabled: bool = True
    #: Multiplier on the per-iteration TPOT slack (eq. 15); the paper found 1.25 best.
    eta: float = 1.25
    #: DPI_load^high of eq. (12): no stealing onto a decode worker loaded at or above it.
    dpi_load_high: float = 0.6
    eps: float = DEFAULT_EPS
    #: Eq. (17) as the paper states it: each of the |P| paired prefill workers may commit
    #: 1/|P| of the room. Off by default (see ``advertised_budget``): every commit is counted
    #: against the room instead, so the even split only throttles stealing.
    split_budget: bool = False

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


def advertised_budget(
    tpot_slo: float,
    decode: DecodeIterPredictor,
    suffix: SuffixPredictor,
    batch: int,
    context: int,
    pending_suffixes: Iterable[tuple[int, int]],
    dpi_load_d: float,
    n_prefill: int,
    cfg: FluidTokenConfig,
    admitting: bool = True,
    kv_forecast: float = 0.0,
) -> float:
    """The per-prefill-worker budget a decode worker advertises: eqs. (14)-(17) over its
    running batch.

    The suffixes already committed to it but not yet run (``pending_suffixes``, their token
    counts and the prefixes they extend) take their predicted extend time, each with its
    fixed cost s0, from the eq. (15)
    allowance of ``SUFFIX_QUEUE_ITERATIONS`` iterations, so that budgets refreshed every
    prefill iteration cannot pile up more stolen work than those iterations run.
    (Subtracting their tokens alone let a burst commit dozens of 20-token suffixes to a
    worker whose allowance held five: at s0 = 12 ms each they waited 0.8 s for their
    iterations and two in three missed the TTFT they were stolen to save.)

    ``admitting`` False (requests wait for KV there, or it is draining) advertises 0: decode
    admission is the bottleneck, and an extend would only lengthen the iterations whose
    finishes free that KV. So does a ``kv_forecast`` (``KvIntake.forecast``) of 1 or more:
    the requests coming in will take the KV before the streams an extend delays free it.

    The room is advertised whole to every paired prefill worker unless ``cfg.split_budget``
    (eq. 17's 1/|P| share). Eq. (17) splits it because the paper's prefill workers plan
    against one advertisement without seeing each other's commits. Here every commit is
    counted in ``pending_suffixes`` and a prefill worker reads the budget again after it
    commits, so the split is not needed to bound the stolen work, and it caps the rate of
    stealing below what the slack can run: a prefill worker commits once per prefill
    iteration, so a decode worker paired with six of them got at most one sixth of its room
    per prefill iteration (azure-staged at 40 req/s, 6P2D: the code window met 20 % of its
    SLOs with the split, 77 % without, at 100 % TPOT attainment both ways). Commits that race
    between two reads (live, budgets are refreshed every 100 ms) cannot raise TPOT: the decode
    worker runs suffixes only within each iteration's eta-scaled slack and while its slack bank
    is not overdrawn, so an over-commit waits an iteration.
    """
    if not admitting or kv_forecast >= 1.0:
        return 0.0
    pending_s = sum(suffix.time(tokens, prefix) for tokens, prefix in pending_suffixes)
    slack = tpot_slack(tpot_slo, decode, batch, context)
    slack -= pending_s / (cfg.eta * SUFFIX_QUEUE_ITERATIONS)
    room = max_admissible_suffix(slack, cfg.eta, suffix)
    shares = n_prefill if cfg.split_budget else min(n_prefill, 1)
    return steal_budget(dpi_load_d, room, shares, cfg.dpi_load_high)


def stream_tpot_room(
    tpot_slo: float,
    iteration_s: float,
    streams: Iterable[tuple[float, int, int]],
    stretch: float = 1.0,
    fastest_s: float | None = None,
    joining: Iterable[tuple[float, int]] = (),
) -> float:
    """The most seconds a decode iteration may run past ``iteration_s`` with every running
    stream still within ``tpot_slo`` when it ends, if every later iteration takes
    ``iteration_s`` (beyond the paper). ``streams``: each one's seconds since its first
    token, tokens out so far and ``max_new_tokens``; ``stretch`` scales the time still to run
    (the worker's measured iterations against their prediction, ``IterationError``).

    A stream's TPOT is the mean of its own gaps, so its room is what its TTFT-to-finish
    budget, ``S_TPOT (max_new_tokens - 1)``, has left after the time it has spent and the
    iterations it still needs: ``(S (N - 1) - elapsed) / stretch - (N - out) T_iter``. The
    slack bank (``slack_bank_update``) holds the worker's mean iteration at S_TPOT; a stream
    of a few tokens sees only a few iterations, and its first gap includes the iteration it
    waited to join. Streams of 2-4 tokens behind a worker stealing without pause (a prefill
    pool past capacity, Qwen3-14B/A100, 1 s / 50 ms) missed TPOT in 55 % of cases where the
    static split met it for all, and the run's TPOT attainment fell from 100 % to 72.8 %.

    A stream past its budget even with no suffix (a long first gap) is not counted: it misses
    TPOT whatever this iteration does, and would hold back every suffix until it ends. Past
    it means past it even if every later iteration took ``fastest_s`` (default
    ``iteration_s``): a harness that measures its iterations' spread passes the fastest it
    saw. With the typical iteration alone, a stream held at the edge of its room reads past
    it by one iteration's noise within a few checks; the waiting suffix then runs and takes
    the stream past its target for good. On a real SGLang decode server (H100, 24 streams,
    sixteen 6,000-token suffixes, a TPOT target 1.5 x the streams' own), every stream missed
    with the room as without it (results/sglang/h100-room-2026-12-06).
    ``joining``: for each request the extend adds to the batch, the seconds it adds to every
    iteration it decodes in and how many it decodes in at most (its ``max_new_tokens``): a
    stream pays that for each of its own remaining iterations the joining request shares. A
    stolen request's stream slows every step while it decodes, which an extend's own seconds
    leave out; on a real SGLang decode server (H100, twelve streams), one 12,000-token stream
    in the batch took each step from about 8.2 to 12.5 ms. Counting the extend alone, the room
    let four such suffixes run in the streams' first four seconds, the streams fell past
    their pace, were given up, and met TPOT in none of 12 at a target of 1.5 x their own
    (results/sglang/h100-room-2026-12-06, run6).

    ``inf`` with no stream left to protect."""
    fastest = iteration_s if fastest_s is None else min(fastest_s, iteration_s)
    joins = [(max(0.0, seconds), steps) for seconds, steps in joining if steps > 0]
    room = math.inf
    for elapsed, out, limit in streams:
        if limit <= 1:
            continue
        remaining = max(1, limit - out)
        budget = (tpot_slo * (limit - 1) - elapsed) / stretch
        if budget - remaining * fastest >= 0:
            slowed = sum(seconds * min(remaining, steps) for seconds, steps in joins)
            room = min(room, max(0.0, budget - remaining * iteration_s - slowed))
    return room


@dataclass(slots=True)
class IterationError:
    """How a decode worker's measured iterations compare with their prediction: the running
    mean of ``measured / predicted`` (exponentially weighted), ``stream_tpot_room``'s
    ``stretch`` (at least 1): an engine that drifts slower than its profile runs every later
    iteration that much longer. (``OnlineCalibrator``'s scale candidate reads the same drift,
    but only in adaptive mode, which refits the predictor itself; this ratio then stays near
    1, and without it, it is the one correction the room gets.)

    The mean only, with no margin for one iteration's noise: a stream left at its room then
    misses TPOT about as often as it meets it, but a margin is a room every stream loses
    for good. With the mean plus two standard deviations (5 % engine noise), FluidToken at
    4P2D on 159-token prompts (Llama-3.1-8B/A100, 1 s / 50 ms, 1.1x) met 38.6 % of the SLOs
    (TPOT 100 %) against 46.0 % (TPOT 98.5 %) holding no stream's room, and 46.8 % (TPOT
    99.9 %) with the mean alone."""

    weight: float = 0.05
    mean: float = 1.0
    seen: int = 0

    def add(self, predicted_s: float, measured_s: float) -> None:
        if predicted_s <= 0 or measured_s <= 0:
            return
        ratio = measured_s / predicted_s
        self.mean = ratio if self.seen == 0 else self.mean + self.weight * (ratio - self.mean)
        self.seen += 1

    @property
    def stretch(self) -> float:
        return max(1.0, self.mean)


def kv_occupancy_forecast(
    tokens: float, window_steps: float, hold_steps: float, capacity: int
) -> float:
    """The KV a decode worker would hold, as a fraction of ``capacity``, if requests kept
    coming as they did over the last ``window_steps`` decode iterations (``tokens``: the KV
    they commit) and each held its KV ``hold_steps`` iterations: Little's law,
    ``rate * hold / capacity``. At 1 or more the worker's KV admission is at its edge."""
    if capacity <= 0:
        return math.inf
    if window_steps <= 0 or tokens <= 0:
        return 0.0
    return tokens / window_steps * hold_steps / capacity


@dataclass(slots=True)
class KvIntake:
    """The requests a decode worker was handed (their KV commitment and the iterations they
    will hold it, their clipped output), clocked in its own decode iterations; what
    ``KvIntake.forecast`` reads the edge of KV admission from (beyond the paper).

    A stolen suffix lengthens the iterations of every stream in the batch, so each of them
    frees its KV that much later. That costs nothing while the KV has room for what keeps
    coming; at the edge it delays every admission after it, and a decode pool at its KV
    capacity never wins that time back. Eqs. (12)-(17) see only this iteration's TPOT slack
    and load. Long generations in a burst (long-long-bursty at 1.56 req/s, 8B/A100, 2P2D):
    54 suffixes stolen while the burst filled the decode KV, 50 of whose requests missed TTFT
    anyway, and the admissions behind the delayed streams missed 11 more over the next five
    minutes (FluidToken 60.5 % against 61.9 % static)."""

    _items: deque[tuple[int, int, int]] = field(default_factory=deque)
    _tokens: int = 0
    _hold: int = 0

    def add(self, step: int, prompt_len: int, max_new_tokens: int, output_clip: int) -> None:
        """A request handed over at decode iteration ``step``: it commits its prompt and
        clipped output (as its KV reservation does) and holds them that many iterations."""
        commit = kv_commitment(prompt_len, max_new_tokens, output_clip)
        hold = commit - prompt_len
        self._items.append((step, commit, hold))
        self._tokens += commit
        self._hold += hold

    def forecast(self, step: int, capacity: int) -> float:
        """``kv_occupancy_forecast`` at the mean hold of the requests kept, over the last
        half of it: the mean remaining life of the streams an extend would delay, which is
        as far ahead as the forecast needs to look. (Over a whole hold, the rate would only
        restate the KV held now.)"""
        items = self._items
        if not items:
            return 0.0
        hold = self._hold / len(items)
        window = max(1.0, hold / 2.0)
        while items and items[0][0] < step - window:
            _, commit, h = items.popleft()
            self._tokens -= commit
            self._hold -= h
        return kv_occupancy_forecast(self._tokens, window, hold, capacity)


@dataclass(frozen=True, slots=True)
class StealPlan:
    """Algorithm 1's output for one queue."""

    #: Tokens stolen from each queued request (beta_i = stolen_i / L_i).
    stolen: IntArray
    #: Queue PPI before stealing, eq. (5), as a by-product.
    ppi: float

    def betas(self, lengths: IntArray) -> FloatArray:
        return np.where(lengths > 0, self.stolen / np.maximum(lengths, 1), 0.0)


def _suffix_caps(
    lengths: FloatArray, allowance: FloatArray, credit: float, suffix: SuffixPredictor
) -> FloatArray:
    """The largest x <= L of each ``length`` L with g(y) <= 0 for every 1 <= y <= x, where
    g(y) = T_sfx(y | L - y) - credit y - allowance: the suffix of y tokens of the prompt,
    extending the L - y before it, less ``credit`` per token, within ``allowance`` (0 where
    g(1) > 0).

    g(y) = (s2 - sp) y^2 + (s1 + sp L - credit) y + (s0 - allowance). Convex (s2 > sp), the
    cap is its upper root; concave (the attention over the prefix, sp p y, shrinks as the
    suffix takes more of the prompt), the first root past its vertex, or the whole prompt
    where g never returns above 0."""
    a = suffix.s2 - suffix.sp
    b = suffix.s1 + suffix.sp * lengths - credit
    c = suffix.s0 - allowance
    if a > 0:
        fits = np.floor((np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a))
    elif a < 0:
        # g falls from y = 1 on where its vertex -b / 2a is at or before 1 (b <= -2a), and
        # never reaches 0 again without real roots; elsewhere the rationalised smaller root
        # (c < 0 there). Divisors are made safe rather than warnings silenced: this runs
        # every prefill iteration.
        disc = b * b - 4.0 * a * c
        falls = (b <= -2.0 * a) | (disc < 0) | (c >= 0)
        denom = np.where(falls, 1.0, b + np.sqrt(np.maximum(disc, 0.0)))
        fits = np.where(falls, lengths, np.floor(-2.0 * c / denom))
    else:
        rising = b > 0
        fits = np.where(rising, np.floor(-c / np.where(rising, b, 1.0)), lengths)
    fits = np.minimum(np.maximum(fits, 0.0), lengths)
    # Floor of a float root can land one above the true integer bound; check and step back.
    fits = fits - ((a * fits + b) * fits + c > 0)
    fits[a + b + c > 0] = 0.0
    out: FloatArray = np.maximum(fits, 0.0)
    return out


def _donor_caps(
    lengths: FloatArray,
    slack: FloatArray,
    violating: BoolArray,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
) -> FloatArray:
    """Most tokens each request can give without itself turning TTFT-unschedulable.

    Donating x tokens shortens a request's prefix work by at least c1 x but moves its own
    deadline earlier by T_sfx(x | L - x) (eq. 9), so x > 0 is safe when
    T_sfx(x | L - x) - c1 x <= slack (``_suffix_caps``). A request already predicted to miss
    its deadline can give everything. This guard is our addition to Algorithm 1's
    eligibility rule; it is what makes "stealing never increases predicted violations" hold
    when the suffix predictor is costlier per token than the prefill predictor. With
    s1 + sp L <= c1, s2 <= sp and s0 = 0 it never binds.
    """
    fits = _suffix_caps(lengths, slack, prefill.c1, suffix)
    fits[violating] = lengths[violating]
    return fits


def _suffix_cap(length: float, allowance: float, credit: float, suffix: SuffixPredictor) -> float:
    """``_suffix_caps`` for one request, in scalar arithmetic: the scheduler's per-iteration
    path needs only the head's cap, and numpy's per-call overhead would dominate it. Kept
    equal to the array form by a property test."""
    a = suffix.s2 - suffix.sp
    b = suffix.s1 + suffix.sp * length - credit
    c = suffix.s0 - allowance
    if a + b + c > 0:
        return 0.0
    disc = b * b - 4.0 * a * c
    root = math.sqrt(max(disc, 0.0))
    fits: float
    if a > 0:
        fits = math.floor((root - b) / (2.0 * a))
    elif a < 0:
        falls = b <= -2.0 * a or disc < 0 or c >= 0
        fits = length if falls else math.floor(-2.0 * c / (b + root))
    else:
        fits = math.floor(-c / b) if b > 0 else length
    fits = min(max(fits, 0.0), length)
    if (a * fits + b) * fits + c > 0:
        fits -= 1.0
    return max(fits, 0.0)


def _head_cap(
    length: float, slack: float, prefill: PrefillPredictor, suffix: SuffixPredictor
) -> float:
    """``_donor_caps`` for one on-time request (the head)."""
    return _suffix_cap(length, slack, prefill.c1, suffix)


def plan_stealing(
    lengths: IntArray | FloatArray,
    deadlines: FloatArray,
    decode_index: IntArray,
    budgets: FloatArray,
    now: float,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
    backlog_s: float = 0.0,
    eps: float = DEFAULT_EPS,
    head_only: bool = False,
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
    when c2 > 0 (each stolen token then saves more than c1). Vectorised so that a queue of a
    few hundred requests plans in tens of microseconds.

    ``head_only`` computes only the head's share (the others are left 0), which is all a
    scheduler commits per iteration: every later request's ``ahead`` includes the head's whole
    share, so the head gives min(its share, the largest deficit behind it).
    """
    n = len(lengths)
    if n == 0:
        return StealPlan(np.zeros(0, dtype=np.int64), 0.0)
    lengths_f = np.asarray(lengths, dtype=np.float64)
    work = cumulative_prefill_work(lengths_f, prefill, backlog_s)
    ppi = float(request_ppi(work, deadlines, now, eps).max())
    if ppi <= 1.0:
        return StealPlan(np.zeros(n, dtype=np.int64), ppi)
    need = np.ceil(token_deficits(work, deadlines, now, prefill) - 1e-9)
    violating = need > 0
    budget_tokens = np.floor(np.maximum(budgets, 0.0))
    # Requests on time have need <= 0, so plain maxima below equal maxima over violators.
    if need.max() <= 0 or budget_tokens.max() <= 0:
        return StealPlan(np.zeros(n, dtype=np.int64), ppi)

    slack = (deadlines - now) - work
    if head_only:
        stolen = np.zeros(n, dtype=np.int64)
        length = float(lengths_f[0])
        head_cap = length if violating[0] else _head_cap(length, float(slack[0]), prefill, suffix)
        budget = float(budget_tokens[decode_index[0]])
        # Within the extend time the budget stands for (eq. 16 turns it into tokens at no
        # prefix), with the attention over the head's own prefix counted.
        fits = _suffix_cap(length, suffix.time(budget), 0.0, suffix)
        behind = max(0.0, float(need[1:].max())) if n > 1 else 0.0
        stolen[0] = int(min(head_cap, fits, budget, behind))
        return StealPlan(stolen, ppi)
    # The extend time each decode worker's budget stands for (eq. 16 at no prefix).
    allowance = suffix.time(budget_tokens)
    caps = np.minimum(
        _donor_caps(lengths_f, slack, violating, prefill, suffix),
        _suffix_caps(lengths_f, allowance[decode_index], 0.0, suffix),
    )

    # Donors fill in queue order, each decode worker's donors capped by its budget: a donor
    # gives min(B_d, its group's cumulative caps including it) - min(B_d, excluding it).
    if len(budget_tokens) == 1:
        cum_incl = np.cumsum(caps)
    else:
        groups = decode_index[:, None] == np.arange(len(budget_tokens))
        cum_incl = np.cumsum(groups * caps[:, None], axis=0)[np.arange(n), decode_index]
    budget_of = budget_tokens[decode_index]
    effective = np.minimum(cum_incl, budget_of) - np.minimum(cum_incl - caps, budget_of)

    ahead = np.cumsum(effective) - effective  # A_i: tokens available from donors j < i
    total = float(np.minimum(need, ahead).max())
    if total <= 0:
        return StealPlan(np.zeros(n, dtype=np.int64), ppi)
    stolen = np.minimum(np.maximum(total - ahead, 0.0), effective)
    return StealPlan(stolen.astype(np.int64), ppi)
