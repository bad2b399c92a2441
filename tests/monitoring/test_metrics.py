"""The metrics the dashboards and SLO rules are built on: the sidecar's per-request SLO
counters (the simulator's attainment rule) and the controller's decision/event series."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from fluidpd.controller.metrics import ControllerMetrics
from fluidpd.core.fluidrole import PoolPressure, Recommendation, SwitchDecision
from fluidpd.core.types import SLO, DrainMode, Request, Role
from fluidpd_sidecar.metrics import SidecarMetrics


def _sidecar(ttft: float = 2.0, tpot: float = 0.1) -> SidecarMetrics:
    service: Any = SimpleNamespace(cfg=SimpleNamespace(worker_id="w7", slo=SLO(ttft, tpot)))
    return SidecarMetrics(service)


def _finish(
    m: SidecarMetrics, ttft: float, tokens: int, tpot: float, arrival: float = 100.0
) -> None:
    req = Request(rid=1, arrival=arrival, prompt_len=64, max_new_tokens=tokens)
    req.first_token_t = arrival + ttft
    m.finished(req, req.first_token_t + tpot * (tokens - 1), tokens)


def _count(registry: CollectorRegistry, slo: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "fluidpd_slo_requests_total", {"worker": "w7", "slo": slo, "outcome": outcome}
    )
    assert value is not None
    return value


def test_slo_counters_follow_the_simulators_rule() -> None:
    m = _sidecar()
    reg = m.registry
    # Every series exists before any request, at zero.
    assert all(_count(reg, s, o) == 0 for s in ("ttft", "tpot", "all") for o in ("met", "missed"))
    _finish(m, ttft=1.0, tokens=11, tpot=0.05)  # both met
    _finish(m, ttft=3.0, tokens=11, tpot=0.05)  # TTFT missed
    _finish(m, ttft=1.0, tokens=11, tpot=0.5)  # TPOT missed
    _finish(m, ttft=2.5, tokens=1, tpot=0.0)  # one token: TPOT met by definition
    assert (_count(reg, "ttft", "met"), _count(reg, "ttft", "missed")) == (2, 2)
    assert (_count(reg, "tpot", "met"), _count(reg, "tpot", "missed")) == (3, 1)
    assert (_count(reg, "all", "met"), _count(reg, "all", "missed")) == (1, 3)
    # The boundary counts as met (<=), like fluidpd.sim.metrics.good_mask (exact binary
    # fractions, so no rounding decides it).
    edge = _sidecar(ttft=2.0, tpot=0.25)
    _finish(edge, ttft=2.0, tokens=3, tpot=0.25, arrival=0.0)
    assert _count(edge.registry, "all", "met") == 1


def test_slo_targets_and_presized_series_are_exported() -> None:
    reg = _sidecar(ttft=1.5, tpot=0.05).registry
    target = reg.get_sample_value
    assert target("fluidpd_slo_target_seconds", {"worker": "w7", "slo": "ttft"}) == 1.5
    assert target("fluidpd_slo_target_seconds", {"worker": "w7", "slo": "tpot"}) == 0.05
    for source, dest in (("prefill", "decode"), ("decode", "prefill")):
        labels = {"worker": "w7", "source": source, "target": dest}
        assert target("fluidpd_role_switches_total", labels) == 0
    assert target("fluidpd_drain_seconds_count", {"worker": "w7"}) == 0


def test_controller_metrics_per_deployment() -> None:
    m = ControllerMetrics()
    a = m.for_deployment("ns1", "a")
    b = m.for_deployment("ns2", "b")
    get = m.registry.get_sample_value
    key_a = {"fluidpd_namespace": "ns1", "fluidpd_deployment": "a"}
    for rec in Recommendation:
        assert get("fluidpd_controller_decisions_total", {**key_a, "decision": rec.value}) == 0
    a.decided(Recommendation.NONE)
    a.decided(Recommendation.NEEDS_CAPACITY)
    a.decided(
        SwitchDecision("w1", Role.PREFILL, Role.DECODE, DrainMode.WAIT, PoolPressure(0.1, 1.2, 0.9))
    )
    assert get("fluidpd_controller_decisions_total", {**key_a, "decision": "none"}) == 1
    assert get("fluidpd_controller_decisions_total", {**key_a, "decision": "needs-capacity"}) == 1
    assert get("fluidpd_controller_decisions_total", {**key_a, "decision": "prefill->decode"}) == 1
    a.event("switch-started")
    assert get("fluidpd_controller_switch_in_progress", key_a) == 1
    a.event("switch-finished", drain_s=0.7)
    assert get("fluidpd_controller_switch_in_progress", key_a) == 0
    assert get("fluidpd_controller_switch_seconds_count", key_a) == 1
    assert get("fluidpd_controller_switch_seconds_sum", key_a) == 0.7
    a.pressure(PoolPressure(1.4, 0.3, 0.2))
    assert get("fluidpd_controller_pool_pressure", {**key_a, "signal": "ppi"}) == 1.4
    # The other deployment's series are its own.
    key_b = {"fluidpd_namespace": "ns2", "fluidpd_deployment": "b"}
    assert get("fluidpd_controller_decisions_total", {**key_b, "decision": "none"}) == 0
    b.remove()
    assert get("fluidpd_controller_decisions_total", {**key_b, "decision": "none"}) is None
    assert get("fluidpd_controller_decisions_total", {**key_a, "decision": "none"}) == 1
