"""FluidPD's pressure report from the hook's snapshot of SGLang's scheduler.

The signals are the core's (``fluidpd.core.signals``: eqs. 5-8), computed from SGLang's own
state instead of FluidPD's scheduler bookkeeping: the prefill queue is SGLang's bootstrap queue
(waiting for the decode side's KV pre-allocation) plus its waiting queue (bootstrapped, not
started), each request with its prompt length and the router's arrival time (the sidecar
knows it; SGLang's queue-entry stamp is the fallback); the decode side's batch, used KV,
pre-allocated (reserved, transfer not yet landed) KV and capacity come straight from the
scheduler. The advertised stealing budget is filled in by the service
(``fluidtoken.DecodeSplits.budget``, from this report's DPI_load and the same snapshot).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fluidpd.api.internal import PressureReport
from fluidpd.core.profile import Profile
from fluidpd.core.signals import allocatable_kv, dpi_adm, dpi_load, queue_ppi
from fluidpd.core.types import SLO, Role, RoleState


def _queue(
    entries: list[dict[str, Any]], arrivals: Mapping[str, float], key: str
) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([e["prompt_len"] for e in entries], dtype=np.int64)
    times = np.array([arrivals.get(e["rid"], e[key]) for e in entries], dtype=np.float64)
    return lengths, times


def pressure_report(
    snap: Mapping[str, Any],
    *,
    worker: str,
    role: Role,
    profile: Profile,
    slo: SLO,
    arrivals: Mapping[str, float],
    now: float,
    retiring: bool = False,
    in_flight: int = 0,
    eps: float = 1e-3,
) -> PressureReport:
    """``arrivals``: router arrival time by SGLang rid (``str(rid)``) of the halves held here;
    ``in_flight``: halves this sidecar is still serving (a retiring worker is drained at 0)."""
    capacity = max(1, int(snap.get("kv_capacity", 0)))
    pre_allocated = int(snap.get("kv_pre_allocated", 0))
    active = max(0, int(snap.get("kv_used", 0)) - pre_allocated)
    batch = int(snap.get("decode_batch", 0))
    bootstrap = list(snap.get("bootstrap", []))
    waiting = list(snap.get("waiting", []))
    common = {
        "worker": worker,
        "role": role,
        "state": RoleState.ACTIVE,
        "kv_capacity": capacity,
        "steal_budget": 0.0,
        "drained": in_flight == 0,
        "retiring": retiring,
        "t": now,
    }
    if role is Role.PREFILL:
        queued = bootstrap + waiting
        lengths, arr = _queue(queued, arrivals, "arrival")
        predictor = profile.prefill_predictor()
        ppi = queue_ppi(lengths, arr, now, slo.ttft, predictor, 0.0, eps)
        # Time spent waiting for decode admission is decode pressure: count a request's TTFT
        # budget from when it left the bootstrap queue (as FluidPD's own scheduler does).
        w_len, w_ready = _queue(waiting, {}, "arrival")
        attributable = queue_ppi(w_len, w_ready, now, slo.ttft, predictor, 0.0, eps)
        work = float(np.sum(predictor.time(lengths.astype(np.float64)))) if len(lengths) else 0.0
        return PressureReport(
            **common,
            queue_ppi=ppi,
            attributable_ppi=attributable,
            queue_len=len(queued),
            dpi_load=0.0,
            dpi_adm=0.0,
            batch=0,
            kv_used=0,
            kv_reserved=0,
            drain_cost=work,
        )
    mean_ctx = int(snap.get("decode_context", 0)) / batch if batch else 0.0
    n_tpot = profile.n_tpot(slo.tpot, mean_ctx if batch else None)
    held = len(snap.get("prealloc", [])) + len(snap.get("transfer", [])) + len(waiting)
    return PressureReport(
        **common,
        queue_ppi=0.0,
        attributable_ppi=0.0,
        queue_len=held,
        dpi_load=dpi_load(active, capacity, batch, n_tpot),
        dpi_adm=dpi_adm(allocatable_kv(capacity, active, pre_allocated), capacity),
        batch=batch,
        kv_used=active,
        kv_reserved=pre_allocated,
        drain_cost=float(batch + held),
        kv_waiting=len(snap.get("prealloc", [])),
    )


def step_gauges(snap: Mapping[str, Any]) -> dict[str, tuple[float, int]]:
    """Median wall time and count of the last steps the hook saw, by kind (decode, extend):
    SGLang's own gauges have no per-step time."""
    out: dict[str, tuple[float, int]] = {}
    for kind in ("decode", "extend"):
        durs = sorted(float(s["dur"]) for s in snap.get("steps", []) if s.get("kind") == kind)
        if durs:
            out[kind] = (durs[len(durs) // 2], len(durs))
    return out
