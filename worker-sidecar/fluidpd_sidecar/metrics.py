"""Prometheus metrics of one sidecar (prometheus-client), including the SGLang-compatible
gauges the Gateway API Inference Extension reads (``sglang:num_queue_reqs`` and friends).

SLO attainment is counted exactly, per finished request, against this worker's own targets
(``fluidpd_slo_requests_total{slo, outcome}``, with the targets as ``fluidpd_slo_target_seconds``),
so the dashboards' attainment does not depend on a histogram bucket sitting at the SLO. The
decode worker records a request (it sees both its first token and its last)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fluidpd.core.types import Request, Role

if TYPE_CHECKING:
    from fluidpd_sidecar.service import SidecarService

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
_TPOT = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class _Gauges(Collector):
    """Point-in-time gauges read from the scheduler at scrape time (no bookkeeping on the
    request path)."""

    def __init__(self, service: SidecarService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        svc = self.service
        p = svc.pressure()
        worker = svc.cfg.worker_id
        gauges = {
            "fluidpd_queue_length": (
                "Requests queued (prefill) or waiting for KV (decode)",
                p.queue_len,
            ),
            "fluidpd_running_batch": ("Requests in the running decode batch", p.batch),
            "fluidpd_kv_used_tokens": ("KV tokens held by active requests", p.kv_used),
            "fluidpd_kv_reserved_tokens": ("KV tokens reserved, not yet in use", p.kv_reserved),
            "fluidpd_kv_capacity_tokens": ("KV capacity in tokens", p.kv_capacity),
            "fluidpd_ppi": ("Queue-level prefill pressure index, eq. 5", p.queue_ppi),
            "fluidpd_ppi_attributable": (
                "PPI with decode-admission wait excluded",
                p.attributable_ppi,
            ),
            "fluidpd_dpi_load": ("Decode pressure, load component, eq. 7", p.dpi_load),
            "fluidpd_dpi_adm": ("Decode pressure, admission component, eq. 8", p.dpi_adm),
            "fluidpd_steal_budget_tokens": (
                "Advertised per-prefill stealing budget, eq. 17",
                p.steal_budget,
            ),
            "fluidpd_stolen_tokens": (
                "Prompt tokens this worker's queue gave to decode workers",
                p.stolen_tokens,
            ),
            "sglang:num_queue_reqs": ("Queued requests (SGLang-compatible)", p.queue_len),
            "sglang:num_running_reqs": ("Running requests (SGLang-compatible)", p.batch),
            "sglang:token_usage": (
                "KV token usage fraction (SGLang-compatible)",
                (p.kv_used + p.kv_reserved) / max(1, p.kv_capacity),
            ),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(name, doc, labels=["worker"])
            g.add_metric([worker], float(value))
            yield g
        role = GaugeMetricFamily(
            "fluidpd_worker_role",
            "1 for the worker's current role",
            labels=["worker", "role", "state"],
        )
        for r in Role:
            role.add_metric([worker, r.value, p.state.value], 1.0 if p.role is r else 0.0)
        yield role


class SidecarMetrics:
    def __init__(self, service: SidecarService) -> None:
        self.registry = CollectorRegistry()
        labels = ["worker"]
        self._worker = service.cfg.worker_id
        self.ttft = Histogram(
            "fluidpd_ttft_seconds",
            "Time to first token",
            labels,
            buckets=_LATENCY,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "fluidpd_tpot_seconds",
            "Time per output token after the first",
            labels,
            buckets=_TPOT,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "fluidpd_e2e_seconds",
            "Request latency",
            labels,
            buckets=_LATENCY,
            registry=self.registry,
        )
        self.queue = Histogram(
            "fluidpd_queue_time_seconds",
            "Prefill queueing time",
            labels,
            buckets=_LATENCY,
            registry=self.registry,
        )
        self.switches = Counter(
            "fluidpd_role_switches",
            "Completed role switches",
            ["worker", "source", "target"],
            registry=self.registry,
        )
        self.drain = Histogram(
            "fluidpd_drain_seconds",
            "Drain + switch duration of a role switch",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            registry=self.registry,
        )
        self.kv_sent = Counter(
            "fluidpd_kv_sent_bytes",
            "KV bytes handed off to decode peers",
            labels,
            registry=self.registry,
        )
        self.kv_received = Counter(
            "fluidpd_kv_received_bytes",
            "KV bytes that arrived in room reserved here (decode side)",
            labels,
            registry=self.registry,
        )
        self.kv_corrupted = Counter(
            "fluidpd_kv_corrupted",
            "KV hand-offs whose bytes failed verification",
            labels,
            registry=self.registry,
        )
        # Every labelled series exists (at 0) from the start, so the dashboards' queries have
        # data before the first request or switch.
        for metric in (self.ttft, self.tpot, self.e2e, self.queue, self.drain):
            metric.labels(self._worker)
        for counter in (self.kv_sent, self.kv_received, self.kv_corrupted):
            counter.labels(self._worker)
        for source, target in ((Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)):
            self.switches.labels(self._worker, source.value, target.value)
        slo = service.cfg.slo
        self._slo = slo
        targets = Gauge(
            "fluidpd_slo_target_seconds",
            "The worker's SLO targets",
            ["worker", "slo"],
            registry=self.registry,
        )
        targets.labels(self._worker, "ttft").set(slo.ttft)
        targets.labels(self._worker, "tpot").set(slo.tpot)
        slo_requests = Counter(
            "fluidpd_slo_requests",
            "Finished requests by SLO (ttft, tpot, all = both) and outcome (met, missed)",
            ["worker", "slo", "outcome"],
            registry=self.registry,
        )
        self._slo_counts = {
            (kind, met): slo_requests.labels(self._worker, kind, "met" if met else "missed")
            for kind in ("ttft", "tpot", "all")
            for met in (True, False)
        }
        self.registry.register(_Gauges(service))

    def first_token(self, ttft: float) -> None:
        self.ttft.labels(self._worker).observe(ttft)

    def finished(self, req: Request, t: float, generated: int) -> None:
        """``generated``: output tokens (fewer than ``max_new_tokens`` after a stop)."""
        self.e2e.labels(self._worker).observe(t - req.arrival)
        tpot = 0.0
        if generated > 1:
            tpot = (t - req.first_token_t) / (generated - 1)
            self.tpot.labels(self._worker).observe(tpot)
        # The simulator's rule (fluidpd.sim.metrics.good_mask): a one-token answer meets TPOT.
        ttft_ok = req.first_token_t - req.arrival <= self._slo.ttft
        tpot_ok = tpot <= self._slo.tpot
        self._slo_counts["ttft", ttft_ok].inc()
        self._slo_counts["tpot", tpot_ok].inc()
        self._slo_counts["all", ttft_ok and tpot_ok].inc()

    def kv_corrupt(self) -> None:
        self.kv_corrupted.labels(self._worker).inc()

    def queue_time(self, seconds: float) -> None:
        self.queue.labels(self._worker).observe(max(0.0, seconds))

    def switched(self, source: Role, target: Role, drain_s: float) -> None:
        self.switches.labels(self._worker, source.value, target.value).inc()
        self.drain.labels(self._worker).observe(drain_s)
