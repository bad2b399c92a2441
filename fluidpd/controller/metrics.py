"""Prometheus metrics of the FluidRole controller: what it decided each interval, the switches
it started and finished (with their drain time) and those its forecast declined, the pool
pressure and the demand it acted on, and how often it found that the deployment needs more
capacity (both phases pressured).

One ``ControllerMetrics`` (one registry) serves any number of deployments: every series carries
``fluidpd_namespace`` and ``fluidpd_deployment`` (the FluidPDDeployment, or ``fluidpd up``'s
``local/fluidpd``), and ``for_deployment`` gives the view one ``FluidRoleController`` writes.
The operator runs one controller per deployment in one process; ``fluidpd controller
--metrics-port`` serves one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fluidpd.core.fluidrole import PoolPressure, Recommendation, SwitchDecision
from fluidpd.core.policy_forecast import Demand
from fluidpd.core.role_control import UNKNOWN_DEMAND
from fluidpd.core.types import Role

#: Event kinds of ``ControllerEvent``; every one is a series from the start.
EVENT_KINDS = (
    "switch-started",
    "switch-resumed",
    "switch-finished",
    "switch-refused",
    "switch-declined",
    "switch-abandoned",
    "needs-capacity",
)
_DEPLOYMENT = ["fluidpd_namespace", "fluidpd_deployment"]


def demand_signals(d: Demand) -> tuple[tuple[str, float], ...]:
    """The demand gauge's series (``signal`` label) and values."""
    return (("rate", d.rate), ("prompt", d.prompt), ("output", d.output), ("samples", d.samples))


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions = Counter(
            "fluidpd_controller_decisions",
            "Control intervals by outcome: none, a committed switch (prefill->decode, "
            "decode->prefill) or needs-capacity",
            [*_DEPLOYMENT, "decision"],
            registry=self.registry,
        )
        self.events = Counter(
            "fluidpd_controller_events",
            "Controller events by kind",
            [*_DEPLOYMENT, "kind"],
            registry=self.registry,
        )
        self.switching = Gauge(
            "fluidpd_controller_switch_in_progress",
            "1 while a role switch the controller started has not finished",
            _DEPLOYMENT,
            registry=self.registry,
        )
        self.switch_seconds = Histogram(
            "fluidpd_controller_switch_seconds",
            "Drain + switch time of the switches the controller saw finish",
            _DEPLOYMENT,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
            registry=self.registry,
        )
        self.pool_pressure = Gauge(
            "fluidpd_controller_pool_pressure",
            "The policy's pool pressure of the last interval: ppi (PPI-bar, eq. 20), "
            "dpi_load and dpi_adm (decode-pool means, eqs. 21-22)",
            [*_DEPLOYMENT, "signal"],
            registry=self.registry,
        )
        self.demand = Gauge(
            "fluidpd_controller_demand",
            "The demand the predictive rule read in the last interval (the router's arrivals "
            "over the demand window): rate (requests/s), prompt and output (mean tokens), "
            "samples (arrivals)",
            [*_DEPLOYMENT, "signal"],
            registry=self.registry,
        )
        self.workers = Gauge(
            "fluidpd_controller_workers",
            "Workers that answered the last pressure poll, by role",
            [*_DEPLOYMENT, "role"],
            registry=self.registry,
        )

    def for_deployment(self, namespace: str, name: str) -> DeploymentMetrics:
        return DeploymentMetrics(self, namespace, name)


class DeploymentMetrics:
    """The series of one deployment; all of them exist (at 0) from the start."""

    def __init__(self, m: ControllerMetrics, namespace: str, name: str) -> None:
        self.m = m
        self.key = (namespace, name)
        for rec in Recommendation:
            m.decisions.labels(*self.key, rec.value)
        for kind in EVENT_KINDS:
            m.events.labels(*self.key, kind)
        m.switching.labels(*self.key).set(0)
        m.switch_seconds.labels(*self.key)
        for role in Role:
            m.workers.labels(*self.key, role.value).set(0)
        self.pressure(PoolPressure(0.0, 0.0, 0.0))
        self.demand(UNKNOWN_DEMAND)

    def decided(self, decision: SwitchDecision | Recommendation) -> None:
        if isinstance(decision, SwitchDecision):
            label = f"{decision.source.value}->{decision.target.value}"
        else:
            label = decision.value
        self.m.decisions.labels(*self.key, label).inc()

    def event(self, kind: str, drain_s: float | None = None) -> None:
        self.m.events.labels(*self.key, kind).inc()
        if kind in ("switch-started", "switch-resumed"):
            self.m.switching.labels(*self.key).set(1)
        elif kind in ("switch-finished", "switch-refused", "switch-abandoned"):
            self.m.switching.labels(*self.key).set(0)
        if drain_s is not None:
            self.m.switch_seconds.labels(*self.key).observe(max(0.0, drain_s))

    def pressure(self, p: PoolPressure) -> None:
        self.m.pool_pressure.labels(*self.key, "ppi").set(p.ppi_bar)
        self.m.pool_pressure.labels(*self.key, "dpi_load").set(p.dpi_load_bar)
        self.m.pool_pressure.labels(*self.key, "dpi_adm").set(p.dpi_adm_bar)

    def demand(self, d: Demand) -> None:
        for signal, value in demand_signals(d):
            self.m.demand.labels(*self.key, signal).set(value)

    def worker_count(self, role: Role, n: int) -> None:
        self.m.workers.labels(*self.key, role.value).set(n)

    def remove(self) -> None:
        """Drops the deployment's series (it was deleted)."""
        for rec in Recommendation:
            self.m.decisions.remove(*self.key, rec.value)
        for kind in EVENT_KINDS:
            self.m.events.remove(*self.key, kind)
        self.m.switching.remove(*self.key)
        self.m.switch_seconds.remove(*self.key)
        for role in Role:
            self.m.workers.remove(*self.key, role.value)
        for signal in ("ppi", "dpi_load", "dpi_adm"):
            self.m.pool_pressure.remove(*self.key, signal)
        for signal, _ in demand_signals(UNKNOWN_DEMAND):
            self.m.demand.remove(*self.key, signal)
