"""The router's Prometheus metrics (its own registry, served by ``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fluidpd_router_requests",
            "Requests by outcome",
            ["api", "status"],
            registry=self.registry,
        )
        # Label lookups cost microseconds on every request: bind the common ones once.
        self.ok = {api: self.requests.labels(api, "200") for api in ("chat", "completions")}
        self.inflight = Gauge(
            "fluidpd_router_inflight", "Requests in flight", registry=self.registry
        )
        self.ttft = Histogram(
            "fluidpd_router_ttft_seconds",
            "Time to first token at the router",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.e2e = Histogram(
            "fluidpd_router_e2e_seconds",
            "Request latency at the router",
            buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
            registry=self.registry,
        )
        self.retries = Gauge(
            "fluidpd_router_repairings",
            "Requests re-paired after a half was turned away",
            registry=self.registry,
        )
