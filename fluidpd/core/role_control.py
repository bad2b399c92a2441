"""What every harness feeds the FluidRole policy, in one place (issue #14).

The predictive rule (``policy_forecast``) decides from the workers' pressure *and* the demand
that arrived: each request's arrival time, prompt length and output estimate
(``max_new_tokens``), summed over a window by ``DemandWindow``. The simulator sees arrivals as
events; the live router sees them as requests, numbers them in an :class:`ArrivalLog` and
exports them over its admin API (``fluidpd.api.demand``) to the controller. Both harnesses
then drive one :class:`RoleControl`, so the policy gets the same inputs from the same
observations in virtual and in real time:

* ``RoleControl.arrived(t, prompt, output)`` once per client request (not per re-pairing);
* ``RoleControl.observe(now, signals)`` once per control interval.

Times are the caller's (the core has no clock); a live controller puts the router's arrival
times on its own clock before passing them (``fluidpd.controller.demand``).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    FluidRolePolicy,
    Recommendation,
    SwitchDecision,
    SwitchRule,
    WorkerSignals,
)
from fluidpd.core.policy_forecast import CapacityModel, Demand, DemandWindow
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO

#: Window of the demand the controller's forecast reads (a 120 s window, to leave more of
#: each burst to FluidToken, cost 1.5-8 pp on azure-staged and long-chat-bursty).
DEMAND_WINDOW_S = 60.0

#: Demand when the harness could not read this interval's arrivals (a live router that did
#: not answer): no arrivals to rest on, so the predictive rule takes no switch (its
#: ``Demand.reliable`` is false); the undo of a refuted switch does not need demand.
UNKNOWN_DEMAND = Demand(0.0, 0.0, 0.0, 0.0)


@dataclass(slots=True)
class RoleControl:
    """The FluidRole policy with the demand window that feeds its forecast.

    ``demand`` is None where no arrivals reach the harness (a controller given only worker
    URLs): the policy then decides as the paper does (``FluidRolePolicy.observe`` without a
    demand).
    """

    policy: FluidRolePolicy
    demand: DemandWindow | None
    #: The demand the last observation decided on (None without a demand window).
    last_demand: Demand | None = None

    @classmethod
    def create(
        cls,
        cfg: FluidRoleConfig,
        profile: Profile | None,
        slo: SLO | None,
        fed: bool = True,
    ) -> RoleControl:
        """The policy for one deployment: the capacity model of its workers' profile and SLO
        (None: not known, the paper rule), and a demand window when arrivals are ``fed``."""
        if profile is None or slo is None:
            return cls(FluidRolePolicy(cfg), None)
        model = CapacityModel.from_profile(profile, slo)
        window = DemandWindow(profile.prefill_predictor(), DEMAND_WINDOW_S) if fed else None
        return cls(FluidRolePolicy(cfg, model), window)

    @property
    def predictive(self) -> bool:
        """Whether the predictive rule really decides (asked for, a model and a demand)."""
        return (
            self.policy.cfg.switch_rule is SwitchRule.PREDICTIVE
            and self.policy.model is not None
            and self.demand is not None
        )

    def arrived(self, t: float, prompt: int, output: int) -> None:
        """A client request arrived at ``t`` with ``prompt`` tokens and ``output`` tokens asked
        for (its ``max_new_tokens``)."""
        if self.demand is not None:
            self.demand.add(t, prompt, output)

    def observe(
        self, now: float, signals: Sequence[WorkerSignals], demand_current: bool = True
    ) -> SwitchDecision | Recommendation:
        """One control interval. ``demand_current``: this interval's arrivals were read (a
        live harness whose router did not answer passes False: no predictive switch then)."""
        demand = None
        if self.demand is not None:
            demand = self.demand.demand(now) if demand_current else UNKNOWN_DEMAND
        self.last_demand = demand
        return self.policy.observe(now, signals, demand)


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float
    prompt: int
    output: int


@dataclass(frozen=True, slots=True)
class ArrivalBatch:
    """The arrivals after a reader's cursor: ``arrivals`` are numbers ``next - len(arrivals)``
    to ``next - 1``; ``dropped`` arrivals between the cursor and them are gone (the log keeps
    only its last ``capacity``, and one answer holds at most ``limit``: the newest)."""

    next: int
    dropped: int
    arrivals: list[Arrival]


@dataclass(slots=True)
class ArrivalLog:
    """The router's numbered record of arrivals, for a controller to read in order.

    Numbers start at 0 and grow by one per arrival; a reader passes the ``next`` of its last
    batch to get only what came after it. Bounded: the oldest are forgotten first.
    """

    capacity: int = 65_536
    _items: deque[Arrival] = field(default_factory=deque)
    _next: int = 0

    def add(self, t: float, prompt: int, output: int) -> None:
        self._items.append(Arrival(t, prompt, output))
        self._next += 1
        if len(self._items) > self.capacity:
            self._items.popleft()

    @property
    def next(self) -> int:
        """The number the next arrival will get."""
        return self._next

    def since(self, cursor: int | None, limit: int = 10_000) -> ArrivalBatch:
        """The arrivals numbered ``cursor`` and after (all it keeps for None, or for a cursor
        beyond ``next``: a reader of another log), at most the newest ``limit``."""
        first = self._next - len(self._items)
        if cursor is None or cursor > self._next:
            cursor = first
        start = max(cursor, first, self._next - limit)
        # From the newest end: a reader that keeps up asks for the last few of a long log.
        batch = list(itertools.islice(reversed(self._items), self._next - start))
        batch.reverse()
        return ArrivalBatch(self._next, start - cursor, batch)
