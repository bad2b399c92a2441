"""FluidRole's per-worker role state machine: Active -> Drain -> Switch -> Active (Fig. 8)."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.types import Role, RoleState


class IllegalTransition(ValueError):
    """A role-state transition the state machine does not allow."""


@dataclass(slots=True)
class RoleStateMachine:
    role: Role
    state: RoleState = RoleState.ACTIVE
    target: Role | None = None
    #: Time the current state was entered (the caller's clock).
    since: float = 0.0
    #: Draining to be removed rather than to switch (scale-in).
    retiring: bool = False

    def _busy(self) -> IllegalTransition:
        return IllegalTransition(
            f"a switch to {self.target.value if self.target else '?'} is under way"
        )

    def wants_switch(self, target: Role) -> bool:
        """What a request to switch to ``target`` does (the ``/role`` call of every sidecar):
        True starts a switch; False is a no-op (Active in ``target`` already, or that switch is
        under way: the request is idempotent); another switch or a retirement under way is an
        ``IllegalTransition``."""
        if self.state is RoleState.ACTIVE:
            return self.role is not target
        if self.target is target:
            return False
        raise self._busy()

    def wants_retire(self) -> bool:
        """What a request to retire does: True starts it; False if it is under way already
        (idempotent); a switch under way is an ``IllegalTransition``."""
        if self.retiring:
            return False
        if self.state is not RoleState.ACTIVE:
            raise self._busy()
        return True

    def begin_drain(self, target: Role, now: float) -> None:
        """Active(role) -> Drain, heading for ``target``."""
        if self.state is not RoleState.ACTIVE:
            raise IllegalTransition(f"cannot start a switch while {self.state.value}")
        if target is self.role:
            raise IllegalTransition(f"worker is already {self.role.value}")
        self.state, self.target, self.since = RoleState.DRAIN, target, now

    def begin_retire(self, now: float) -> None:
        """Active -> Drain with no target: the worker empties itself to be removed (scale-in).

        The worker is deleted once drained, unless the retirement is cancelled
        (``cancel_retire``): a scale-in that did not happen must not leave it out of service.
        """
        if self.state is not RoleState.ACTIVE:
            raise IllegalTransition(f"cannot retire while {self.state.value}")
        self.state, self.target, self.since = RoleState.DRAIN, None, now
        self.retiring = True

    def cancel_retire(self, now: float) -> None:
        """Drain (retiring) -> Active in the same role: the worker was not removed."""
        if not self.retiring or self.state is not RoleState.DRAIN:
            raise IllegalTransition("the worker is not retiring")
        self.state, self.since, self.retiring = RoleState.ACTIVE, now, False

    def begin_switch(self, now: float) -> None:
        """Drain -> Switch (the worker has reached a safe boundary)."""
        if self.state is not RoleState.DRAIN:
            raise IllegalTransition(f"cannot switch from {self.state.value}; drain first")
        if self.retiring:
            raise IllegalTransition("a retiring worker does not switch; it is removed")
        self.state, self.since = RoleState.SWITCH, now

    def complete(self, now: float) -> Role:
        """Switch -> Active(target); returns the new role."""
        if self.state is not RoleState.SWITCH or self.target is None:
            raise IllegalTransition(f"cannot complete a switch from {self.state.value}")
        self.role, self.target = self.target, None
        self.state, self.since = RoleState.ACTIVE, now
        return self.role

    @property
    def accepting(self) -> bool:
        """Only an Active worker takes new work."""
        return self.state is RoleState.ACTIVE
