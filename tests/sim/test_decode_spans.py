"""Decode spans (several iterations of an unchanged batch as one event) change nothing but the
event count: with exact step times the simulation is the per-iteration one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidpd.core.fluidrole import FluidRoleConfig, SwitchRule
from fluidpd.core.scheduler.decode import slack_bank_after, slack_bank_update
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile
from fluidpd.sim import simulator
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import build_workload

SPAN = simulator.MAX_SPAN


def _run(
    monkeypatch: pytest.MonkeyPatch,
    span: int,
    workload: str,
    rps: float,
    policy: str,
    rule: SwitchRule = SwitchRule.PREDICTIVE,
) -> simulator.SimResult:
    monkeypatch.setattr(simulator, "MAX_SPAN", span)
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    w = build_workload(workload, rps, context_limit=profile.context_limit, num_requests=300)
    role = FluidRoleConfig(switch_rule=rule)
    cfg = SimConfig(profile, SLO(2.0, 0.1), 2, 2, mechanisms=MECHANISMS[policy], role_cfg=role)
    return simulate(w, cfg)


@pytest.mark.parametrize(
    ("workload", "rps", "policy", "rule"),
    [
        ("long-chat-poisson", 1.0, "fluidpd", SwitchRule.PREDICTIVE),
        ("synthetic", 12.0, "fluidpd", SwitchRule.PREDICTIVE),
        # A D->P drain by migration while a prompt for the worker is still in prefill.
        ("long-chat-poisson", 1.5, "fluidpd", SwitchRule.PAPER),
    ],
)
def test_spans_match_per_iteration_simulation(
    monkeypatch: pytest.MonkeyPatch, workload: str, rps: float, policy: str, rule: SwitchRule
) -> None:
    one = _run(monkeypatch, 1, workload, rps, policy, rule)
    many = _run(monkeypatch, SPAN, workload, rps, policy, rule)
    assert many.events < one.events / 2
    for a, b in zip(one.requests, many.requests, strict=True):
        assert a.failed == b.failed
        assert a.stolen == b.stolen
        if not a.failed:
            assert math.isclose(a.first_token_t, b.first_token_t, rel_tol=1e-9, abs_tol=1e-9)
            assert math.isclose(a.finish_t, b.finish_t, rel_tol=1e-9, abs_tol=1e-9)
    assert [s.as_dict() for s in one.switches] == [s.as_dict() for s in many.switches]


def test_closed_form_slack_bank_is_the_recurrence() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        steps = rng.random(int(rng.integers(1, 40))) * 0.2
        start, cap = float(rng.random() * 0.1 - 0.05), 0.025
        bank = start
        for s in steps:
            bank = slack_bank_update(bank, 0.1, float(s), cap)
        assert math.isclose(bank, slack_bank_after(start, 0.1, steps, cap), abs_tol=1e-12)
