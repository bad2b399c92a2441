"""The operator SIGKILLed in the middle of scale-ins and of role switches, again and again, on
the real test control plane under load through the router: after each restart the scale-in or
the switch completes, no pod restarts, no request is lost.

The steps (where the kills land and how each is staged) are ``harness.operator_chaos``'s, which
``python -m harness.drill_operator`` repeats for many rounds and records as JSON; here each runs
once and is asserted on. ``test_operator.py`` has the load-driven kill mid-drain.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness import ControlPlane
from harness.operator import Operator, events, kubectl_json
from harness.operator_chaos import (
    SCALE_TO,
    SWITCH_STAGES,
    Deployment,
    Kill,
    account,
    chaos_load,
    scale_in_killed,
    start_scale_in_deployment,
    start_switch_deployment,
    switches_killed,
)

pytestmark = pytest.mark.k8s


def _assert_nothing_lost(dep: Deployment, kills: list[Kill], summary: dict[str, Any]) -> None:
    for k in kills:
        assert k.pod_restarts == 0 and not k.pods_replaced, k
    # And none since the last kill's change completed.
    assert not any(dep.restarts().values()) and not dep.replaced()
    assert summary["hung"] == 0
    assert summary["completed"] == summary["sent"], summary
    # The per-kill windows partition the load: the drill's counts add up to the load's.
    assert sum(k.requests["sent"] for k in kills) == summary["sent"]


def test_operator_killed_mid_scale_in_repeatedly(
    control_plane: ControlPlane, operator: Operator, namespace: str, k8s_api: Any
) -> None:
    cp, ns = control_plane, namespace
    dep = start_scale_in_deployment(cp, ns, "chaos-scale")
    load = chaos_load(dep.url, seed=5)
    kills: list[Kill] = []
    try:
        scale_in_killed(dep, k8s_api, operator, kills)
    finally:
        report = load.stop()
    summary = report.summary(120.0)
    account(report.outcomes, kills)
    print(f"operator killed mid scale-in: {kills}; load {summary}")
    assert len(kills) == len(SCALE_TO)
    # The retiring pod was still there at each kill: every kill was mid-way.
    assert all(k.mid_way for k in kills), kills
    retired = {k.pod for k in kills}
    assert len(retired) == 3
    left = dep.pods()
    # Only the retired workers went; the others are the same pods, never restarted.
    assert {p["metadata"]["name"] for p in left} == set(dep.first) - retired
    assert {p["metadata"]["labels"]["fluidpd.io/role"] for p in left} == {"prefill", "decode"}
    assert len(events(cp, ns, "WorkerRemoved")) >= 3
    deployment = kubectl_json(cp, "get", "fpd", dep.name, "-n", ns)
    assert deployment["status"]["workers"] == 3
    # Nothing lost to three interrupted scale-ins.
    _assert_nothing_lost(dep, kills, summary)


def test_operator_killed_mid_switch_repeatedly(
    control_plane: ControlPlane, operator: Operator, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    dep = start_switch_deployment(cp, ns, "chaos-switch")
    load = chaos_load(dep.url, seed=6)
    kills: list[Kill] = []
    try:
        switches_killed(dep, operator, kills)
    finally:
        report = load.stop()
    summary = report.summary(120.0)
    account(report.outcomes, kills)
    print(f"switches finished after an operator kill: {kills}; load {summary}")
    assert [k.where for k in kills] == [f"switch: {s[0]}" for s in SWITCH_STAGES]
    assert all(k.completed_s is not None and k.routed_s is not None for k in kills), kills
    assert len(events(cp, ns, "SwitchResumed")) >= 3
    assert len(events(cp, ns, "SwitchCompleted")) >= 3
    _assert_nothing_lost(dep, kills, summary)
