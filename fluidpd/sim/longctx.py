"""Long-context synthetic workloads (issue #14): prompts of 4-16K tokens, several output mixes,
Poisson or bursty arrivals.

The Azure 2023 traces have median prompts of about 1K (code) and 1K (conv) tokens; a controller
tuned on them alone can do harm where prompts are ten times longer (prefill work per request
grows super-linearly, decode KV per request grows linearly, so the right P/D split and the
right thresholds move). These workloads exist to check FluidPD there; they are not fitted to
any trace.

Names are ``long-<output mix>-<arrivals>``:

output mixes
    ``chat``  lognormal median 300, sigma 0.8, clipped to [16, 2048] (conversation-like);
    ``short`` lognormal median 40, sigma 0.7, clipped to [1, 256] (summarisation / RAG);
    ``long``  lognormal median 1000, sigma 0.5, clipped to [128, 4096] (long generations).
arrivals
    ``poisson`` one Poisson process at ``rps``;
    ``bursty``  a two-state Markov-modulated Poisson process: exponentially distributed phases
    (mean 120 s) alternate between a burst at 2.2x and a lull at about 0.49x the mean rate, so
    that 30 % of the time carries 66 % of the load; arrival times are then scaled so that the
    realised mean rate ((n-1)/span) is exactly ``rps``.

Prompts are lognormal with median 8,192 and sigma 0.4, clipped to [4,096, 16,384].
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

LONG_DEFAULT_REQUESTS = 3_000
LONG_PROMPT = (8192.0, 0.4, 4096, 16384)  # median, sigma, min, max
LONG_OUTPUT_MIXES: dict[str, tuple[float, float, int, int]] = {
    "chat": (300.0, 0.8, 16, 2048),
    "short": (40.0, 0.7, 1, 256),
    "long": (1000.0, 0.5, 128, 4096),
}
LONG_ARRIVALS = ("poisson", "bursty")
LONG_WORKLOAD_NAMES: tuple[str, ...] = tuple(
    f"long-{mix}-{arr}" for mix in LONG_OUTPUT_MIXES for arr in LONG_ARRIVALS
)

#: Bursty arrivals: mean phase length (s), share of time in the burst, burst rate / mean rate.
BURST_PHASE_S = 120.0
BURST_SHARE = 0.3
BURST_FACTOR = 2.2


def lognormal_lengths(
    n: int, params: tuple[float, float, int, int], rng: np.random.Generator
) -> IntArray:
    median, sigma, lo, hi = params
    draws = rng.lognormal(mean=math.log(median), sigma=sigma, size=n)
    return np.clip(np.rint(draws), lo, hi).astype(np.int64)


def poisson_arrivals(n: int, rps: float, rng: np.random.Generator) -> FloatArray:
    gaps = rng.exponential(1.0 / rps, size=max(n - 1, 0))
    return np.concatenate(([0.0], np.cumsum(gaps))).astype(np.float64)


def bursty_arrivals(n: int, rps: float, rng: np.random.Generator) -> FloatArray:
    """Markov-modulated Poisson arrivals by time rescaling: unit-rate Poisson points mapped
    through the inverse of the integrated piecewise-constant rate."""
    low = (1.0 - BURST_SHARE * BURST_FACTOR) / (1.0 - BURST_SHARE)
    unit = np.cumsum(rng.exponential(1.0, size=n))
    # Enough phases to carry n arrivals at the lowest rate, generously.
    horizon = float(unit[-1]) / (low * rps) + BURST_PHASE_S
    edges = [0.0]
    rates: list[float] = []
    burst = bool(rng.random() < BURST_SHARE)
    while edges[-1] < horizon:
        share = BURST_SHARE if burst else 1.0 - BURST_SHARE
        # Phase lengths are in proportion to each state's share of time.
        edges.append(edges[-1] + rng.exponential(2.0 * BURST_PHASE_S * share))
        rates.append(rps * (BURST_FACTOR if burst else low))
        burst = not burst
    t_edges = np.asarray(edges)
    rate = np.asarray(rates)
    cum = np.concatenate(([0.0], np.cumsum(rate * np.diff(t_edges))))
    idx = np.clip(np.searchsorted(cum, unit, side="right") - 1, 0, len(rate) - 1)
    arrivals = t_edges[idx] + (unit - cum[idx]) / rate[idx]
    arrivals -= arrivals[0]
    span = float(arrivals[-1])
    if n > 1 and span > 0:
        arrivals *= (n - 1) / rps / span
    return np.asarray(arrivals, dtype=np.float64)


def build_long(
    name: str, rps: float, seed: int, count: int, rng: np.random.Generator
) -> tuple[FloatArray, IntArray, IntArray, str]:
    """(arrivals, prompts, outputs, description) of ``long-<mix>-<arrivals>``."""
    _, mix, arrival = name.split("-")
    arrivals = (
        poisson_arrivals(count, rps, rng)
        if arrival == "poisson"
        else bursty_arrivals(count, rps, rng)
    )
    prompts = lognormal_lengths(count, LONG_PROMPT, rng)
    outputs = lognormal_lengths(count, LONG_OUTPUT_MIXES[mix], rng)
    p_med, p_sigma, p_lo, p_hi = LONG_PROMPT
    o_med, o_sigma, o_lo, o_hi = LONG_OUTPUT_MIXES[mix]
    note = (
        f"Long-context synthetic {name}: {count:,} requests, {arrival} arrivals at mean "
        f"{rps:g} req/s; prompts lognormal median {p_med:g} sigma {p_sigma:g} clipped to "
        f"[{p_lo}, {p_hi}]; outputs ({mix}) lognormal median {o_med:g} sigma {o_sigma:g} "
        f"clipped to [{o_lo}, {o_hi}]; seed {seed}."
    )
    return arrivals, prompts, outputs, note
