"""The core's pressure is a plain value; its wire form lives with the HTTP protocol and carries
every one of its fields, with the same types, so nothing the controller reads is lost."""

from __future__ import annotations

import dataclasses
import typing

from fluidpd.api.internal import PressureReport, RoleStatus
from fluidpd.core.rolestate import RoleStateMachine
from fluidpd.core.scheduler.worker import Pressure
from fluidpd.core.types import Role, RoleState


def test_pressure_report_carries_every_core_field_with_its_type() -> None:
    core = typing.get_type_hints(Pressure)
    wire = PressureReport.model_fields
    for name, hint in core.items():
        assert name in wire, name
        assert wire[name].annotation == hint, name
    assert [f.name for f in dataclasses.fields(Pressure)] == list(wire)[: len(core)]


def test_pressure_report_of_keeps_values_and_adds_the_sidecars() -> None:
    p = Pressure(
        worker="w1", role=Role.DECODE, state=RoleState.DRAIN, target=Role.PREFILL,
        queue_ppi=0.5, attributable_ppi=0.25, queue_len=3, dpi_load=0.4, dpi_adm=0.3, batch=7,
        kv_used=100, kv_reserved=20, kv_capacity=1000, steal_budget=12.5, drain_cost=2.0,
        drained=True, retiring=True,
    )  # fmt: skip
    r = PressureReport.of(p, switches=2, t=5.0)
    assert {k: getattr(r, k) for k in dataclasses.asdict(p)} == dataclasses.asdict(p)
    assert (r.switches, r.t, r.stolen_tokens) == (2, 5.0, 0)
    again = PressureReport.model_validate_json(r.model_dump_json())
    assert again == r


def test_role_status_of_reads_the_role_state_machine() -> None:
    """Every engine's sidecar answers ``/role`` from its role state machine the same way."""
    sm = RoleStateMachine(Role.DECODE, since=1.0)
    sm.begin_drain(Role.PREFILL, 2.0)
    s = RoleStatus.of("w1", sm, switches=3)
    assert s == RoleStatus(worker="w1", role=Role.DECODE, state=RoleState.DRAIN,
                           target=Role.PREFILL, since=2.0, switches=3, retiring=False)  # fmt: skip
    retiring = RoleStateMachine(Role.PREFILL)
    retiring.begin_retire(4.0)
    assert RoleStatus.of("w2", retiring, switches=0).retiring
