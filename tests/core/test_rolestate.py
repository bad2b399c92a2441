"""FluidRole's role state machine (Fig. 8): Active -> Drain -> Switch -> Active."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fluidpd.core.rolestate import IllegalTransition, RoleStateMachine
from fluidpd.core.types import Role, RoleState


def _snapshot(sm: RoleStateMachine) -> tuple[Role, RoleState, Role | None, float]:
    return sm.role, sm.state, sm.target, sm.since


@pytest.mark.parametrize("start", [Role.PREFILL, Role.DECODE])
def test_legal_path_flips_role(start: Role) -> None:
    sm = RoleStateMachine(start, since=1.0)
    assert sm.accepting
    sm.begin_drain(start.other, 2.0)
    assert _snapshot(sm) == (start, RoleState.DRAIN, start.other, 2.0)
    assert not sm.accepting
    sm.begin_switch(3.0)
    assert _snapshot(sm) == (start, RoleState.SWITCH, start.other, 3.0)
    assert not sm.accepting
    assert sm.complete(4.0) is start.other
    assert _snapshot(sm) == (start.other, RoleState.ACTIVE, None, 4.0)
    assert sm.accepting
    # And back again.
    sm.begin_drain(start, 5.0)
    sm.begin_switch(6.0)
    assert sm.complete(7.0) is start
    assert _snapshot(sm) == (start, RoleState.ACTIVE, None, 7.0)


def _to_state(state: RoleState) -> RoleStateMachine:
    sm = RoleStateMachine(Role.PREFILL)
    if state is not RoleState.ACTIVE:
        sm.begin_drain(Role.DECODE, 1.0)
    if state is RoleState.SWITCH:
        sm.begin_switch(2.0)
    return sm


Step = Callable[[RoleStateMachine], object]
ILLEGAL: list[tuple[RoleState, str, Step]] = [
    (RoleState.ACTIVE, "switch-from-active", lambda sm: sm.begin_switch(9.0)),
    (RoleState.ACTIVE, "complete-from-active", lambda sm: sm.complete(9.0)),
    (RoleState.ACTIVE, "drain-to-same-role", lambda sm: sm.begin_drain(Role.PREFILL, 9.0)),
    (RoleState.DRAIN, "drain-again", lambda sm: sm.begin_drain(Role.DECODE, 9.0)),
    (RoleState.DRAIN, "drain-again-other", lambda sm: sm.begin_drain(Role.PREFILL, 9.0)),
    (RoleState.DRAIN, "complete-from-drain", lambda sm: sm.complete(9.0)),
    (RoleState.SWITCH, "drain-from-switch", lambda sm: sm.begin_drain(Role.DECODE, 9.0)),
    (RoleState.SWITCH, "switch-again", lambda sm: sm.begin_switch(9.0)),
]


@pytest.mark.parametrize(("state", "name", "step"), ILLEGAL, ids=[i[1] for i in ILLEGAL])
def test_illegal_transitions_raise_and_leave_state(state: RoleState, name: str, step: Step) -> None:
    sm = _to_state(state)
    before = _snapshot(sm)
    with pytest.raises(IllegalTransition):
        step(sm)
    assert _snapshot(sm) == before, name


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


@pytest.mark.parametrize("start", [Role.PREFILL, Role.DECODE])
def test_retire_drains_and_never_switches(start: Role) -> None:
    sm = RoleStateMachine(start, since=1.0)
    sm.begin_retire(2.0)
    assert sm.retiring and not sm.accepting
    assert _snapshot(sm) == (start, RoleState.DRAIN, None, 2.0)
    with pytest.raises(IllegalTransition):
        sm.begin_switch(3.0)
    with pytest.raises(IllegalTransition):
        sm.begin_retire(3.0)


def test_cannot_retire_mid_switch() -> None:
    sm = RoleStateMachine(Role.DECODE, since=1.0)
    sm.begin_drain(Role.PREFILL, 2.0)
    with pytest.raises(IllegalTransition):
        sm.begin_retire(3.0)


def test_a_cancelled_retirement_returns_to_active_in_the_same_role() -> None:
    sm = RoleStateMachine(Role.DECODE)
    sm.begin_retire(1.0)
    sm.cancel_retire(2.0)
    assert (sm.role, sm.state, sm.retiring, sm.since) == (Role.DECODE, RoleState.ACTIVE, False, 2.0)
    assert sm.accepting
    with pytest.raises(IllegalTransition):
        sm.cancel_retire(3.0)  # not retiring any more


def test_only_a_retirement_can_be_cancelled() -> None:
    sm = RoleStateMachine(Role.PREFILL)
    sm.begin_drain(Role.DECODE, 1.0)
    with pytest.raises(IllegalTransition):
        sm.cancel_retire(2.0)


def test_a_role_request_starts_a_switch_only_when_it_is_new() -> None:
    sm = RoleStateMachine(Role.PREFILL)
    assert not sm.wants_switch(Role.PREFILL)  # Active there already
    assert sm.wants_switch(Role.DECODE)
    sm.begin_drain(Role.DECODE, 1.0)
    assert not sm.wants_switch(Role.DECODE)  # the same switch is under way
    with pytest.raises(IllegalTransition, match="a switch to decode is under way"):
        sm.wants_switch(Role.PREFILL)
    with pytest.raises(IllegalTransition, match="a switch to decode is under way"):
        sm.wants_retire()


def test_a_retire_request_starts_a_retirement_only_once() -> None:
    sm = RoleStateMachine(Role.DECODE)
    assert sm.wants_retire()
    sm.begin_retire(1.0)
    assert not sm.wants_retire()  # under way: idempotent
    with pytest.raises(IllegalTransition, match=r"a switch to \? is under way"):
        sm.wants_switch(Role.PREFILL)  # what the sidecars have always answered (409)
