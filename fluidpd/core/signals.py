"""Pressure signals: PPI (eqs. 1-5, 9-11), the token deficit (eq. 19) and DPI (eqs. 6-8).

Queue-level functions take numpy arrays in queue (scheduling) order so that a control
iteration over hundreds of queued requests stays in the tens of microseconds.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from fluidpd.core.predictors import FloatArray, PrefillPredictor, SuffixPredictor

IntArray = npt.NDArray[np.int64]

#: Keeps PPI's denominator positive once a deadline has passed (the paper's epsilon).
DEFAULT_EPS = 1e-3


def ttft_deadlines(arrivals: FloatArray, ttft_slo: float) -> FloatArray:
    """t_i^ddl = t_i^arr + S_TTFT, eq. (1)."""
    return arrivals + ttft_slo


def request_ppi(
    cumulative_work: FloatArray, deadlines: FloatArray, now: float, eps: float = DEFAULT_EPS
) -> FloatArray:
    """PPI_i = sum_{k<=i} T_pre(L_k) / max(t_i^ddl - now, eps), eq. (4).

    ``cumulative_work[i]`` is the predicted time until request i's prefill completes. PPI_i <= 1
    is exactly the TTFT-schedulability condition of eq. (3).
    """
    return cumulative_work / np.maximum(deadlines - now, eps)


def cumulative_prefill_work(
    lengths: FloatArray | IntArray, prefill: PrefillPredictor, backlog_s: float = 0.0
) -> FloatArray:
    """Running sum of eq. (2) over the queue, starting from ``backlog_s``.

    ``backlog_s`` is the predicted remaining time of the batch the worker is running now (0 in
    the paper's formulation, which looks at the queue alone).
    """
    work = np.cumsum(prefill.time(np.asarray(lengths, dtype=np.float64)))
    if backlog_s:
        work += backlog_s
    return work


def queue_ppi(
    lengths: FloatArray | IntArray,
    arrivals: FloatArray,
    now: float,
    ttft_slo: float,
    prefill: PrefillPredictor,
    backlog_s: float = 0.0,
    eps: float = DEFAULT_EPS,
) -> float:
    """Queue-level pressure PPI = max_i PPI_i, eq. (5); 0 for an empty queue."""
    if len(lengths) == 0:
        return 0.0
    work = cumulative_prefill_work(lengths, prefill, backlog_s)
    return float(request_ppi(work, ttft_deadlines(arrivals, ttft_slo), now, eps).max())


def prefix_deadlines(
    deadlines: FloatArray, lengths: IntArray, stolen: IntArray, suffix: SuffixPredictor
) -> FloatArray:
    """t_i^pfx-ddl = t_i^ddl - T_sfx(L_sfx,i), eq. (9), each suffix extending the rest of
    its prompt (``SuffixPredictor.of_prompt``)."""
    tokens = np.asarray(stolen, dtype=np.float64)
    return deadlines - suffix.of_prompt(tokens, np.asarray(lengths, dtype=np.float64))


def steal_ppi(
    lengths: IntArray,
    stolen: IntArray,
    deadlines: FloatArray,
    now: float,
    prefill: PrefillPredictor,
    suffix: SuffixPredictor,
    backlog_s: float = 0.0,
    eps: float = DEFAULT_EPS,
) -> FloatArray:
    """PPI_i^steal under a stealing decision, eq. (11) (the normalised form of eq. 10).

    Each request contributes only its prefix work; its own deadline shrinks by its suffix
    time (eq. 9).
    """
    work = cumulative_prefill_work(lengths - stolen, prefill, backlog_s)
    return request_ppi(work, prefix_deadlines(deadlines, lengths, stolen, suffix), now, eps)


def token_deficits(
    cumulative_prefix_work: FloatArray,
    prefix_deadlines_: FloatArray,
    now: float,
    prefill: PrefillPredictor,
) -> FloatArray:
    """X_i = (sum_{k<=i} T_pfx(L_pfx,k) - (t_i^pfx-ddl - now)) / c1, eq. (19).

    The number of prompt tokens that must leave the prefill queue ahead of request i for it to
    become TTFT-schedulable; X_i <= 0 means it already is.
    """
    return (cumulative_prefix_work - (prefix_deadlines_ - now)) / prefill.c1


Tokens = TypeVar("Tokens", int, float)


def kv_commitment(prompt: Tokens, output: Tokens, output_clip: int) -> Tokens:
    """The KV a request reserves on its decode worker before its prefill starts (SGLang's
    prealloc): its prompt and its output clipped at ``output_clip`` (a request's lengths,
    or a demand's means)."""
    return prompt + min(output, output_clip)


def allocatable_kv(capacity: int, active: int, reserved: int) -> int:
    """C_d^alloc = C_d^KV - C_d^active - C_d^reserved, eq. (6)."""
    return capacity - active - reserved


def dpi_load(active_kv: int, capacity: int, batch: int, n_tpot: int) -> float:
    """DPI_d,load = max(C_active / C_KV, N_active / N_TPOT), eq. (7)."""
    kv = active_kv / capacity
    if n_tpot <= 0:
        return max(kv, float("inf") if batch > 0 else 0.0)
    return max(kv, batch / n_tpot)


def dpi_adm(allocatable: int, capacity: int) -> float:
    """DPI_d,adm = 1 - C_alloc / C_KV, eq. (8)."""
    return 1.0 - allocatable / capacity
