"""SLO attainment and latency statistics, with sglang.bench_serving's field names."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fluidpd.core.types import SLO, Request


def _ms_stats(prefix: str, values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {f"mean_{prefix}_ms": None, f"median_{prefix}_ms": None, f"p99_{prefix}_ms": None}
    return {
        f"mean_{prefix}_ms": round(float(values.mean()) * 1e3, 3),
        f"median_{prefix}_ms": round(float(np.median(values)) * 1e3, 3),
        f"p99_{prefix}_ms": round(float(np.percentile(values, 99)) * 1e3, 3),
    }


def good_mask(requests: Sequence[Request], slo: SLO) -> tuple[np.ndarray, np.ndarray]:
    """Per request: (met TTFT, met TPOT); a failed request meets neither."""
    ttft_ok = np.fromiter(
        (not r.failed and r.ttft <= slo.ttft for r in requests), dtype=bool, count=len(requests)
    )
    tpot_ok = np.fromiter(
        (not r.failed and r.tpot <= slo.tpot for r in requests), dtype=bool, count=len(requests)
    )
    return ttft_ok, tpot_ok


def attainment(requests: Sequence[Request], slo: SLO) -> float:
    if not requests:
        return 0.0
    ttft_ok, tpot_ok = good_mask(requests, slo)
    return float((ttft_ok & tpot_ok).mean())


def run_metrics(requests: Sequence[Request], slo: SLO) -> dict[str, object]:
    """The results.json latency/attainment fields for one run (fractions in 0..1)."""
    total = len(requests)
    done = [r for r in requests if not r.failed]
    ttft_ok, tpot_ok = good_mask(requests, slo)
    good = int((ttft_ok & tpot_ok).sum())
    ttft = np.array([r.ttft for r in done], dtype=np.float64)
    tpot = np.array([r.tpot for r in done if r.max_new_tokens > 1], dtype=np.float64)
    e2e = np.array([r.finish_t - r.arrival for r in done], dtype=np.float64)
    start = min((r.arrival for r in requests), default=0.0)
    end = max((r.finish_t for r in done), default=start)
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.max_new_tokens for r in done)
    record: dict[str, object] = {
        "slo_attainment": round(good / total, 6) if total else 0.0,
        "ttft_attainment": round(float(ttft_ok.mean()), 6) if total else 0.0,
        "tpot_attainment": round(float(tpot_ok.mean()), 6) if total else 0.0,
        "completed": len(done),
        "failed": total - len(done),
        "duration": round(duration, 3),
        "request_throughput": round(len(done) / duration, 4),
        "output_throughput": round(out_tokens / duration, 2),
        "request_goodput": round(good / duration, 4),
        "total_input_tokens": sum(r.prompt_len for r in done),
        "total_output_tokens": out_tokens,
    }
    record.update(_ms_stats("ttft", ttft))
    record.update(_ms_stats("tpot", tpot))
    record.update(_ms_stats("e2e_latency", e2e))
    return record


def windowed_attainment(
    requests: Sequence[Request], windows: Sequence[tuple[str, int, int]], slo: SLO
) -> dict[str, float]:
    """SLO attainment per workload window (requests are indexed in workload order)."""
    return {label: round(attainment(requests[a:b], slo), 6) for label, a, b in windows if b > a}


def p95_ttft_series(
    requests: Sequence[Request], bin_s: float, timeout_s: float
) -> tuple[list[float], list[float | None]]:
    """p95 TTFT of the requests arriving in each ``bin_s`` bin (failed ones count as the
    timeout), for the paper's Fig. 10 time series."""
    if not requests:
        return [], []
    arrivals = np.array([r.arrival for r in requests])
    ttfts = np.array([timeout_s if r.failed else r.ttft for r in requests])
    bins = np.floor(arrivals / bin_s).astype(np.int64)
    out_t: list[float] = []
    out_v: list[float | None] = []
    for b in range(int(bins.max()) + 1):
        sel = ttfts[bins == b]
        out_t.append(b * bin_s)
        out_v.append(None if sel.size == 0 else round(float(np.percentile(sel, 95)), 4))
    return out_t, out_v


def finite_or_none(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else x
