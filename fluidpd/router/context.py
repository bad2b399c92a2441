"""What the router's route modules share: settings, tokenizer, worker set, metrics, the
arrivals it exports to the controller, and the dispatcher (made when the app starts, since it
needs the running loop's HTTP session)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from fluidpd.core.role_control import ArrivalLog
from fluidpd.router.config import RouterConfig
from fluidpd.router.dispatch import Dispatcher
from fluidpd.router.metrics import RouterMetrics
from fluidpd.router.prompts import Prompter
from fluidpd.router.workers import WorkerSet


@dataclass(slots=True)
class RouterContext:
    cfg: RouterConfig
    prompter: Prompter
    workers: WorkerSet
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    #: Every client request's arrival, for the controller's demand forecast (``/admin/arrivals``).
    arrivals: ArrivalLog = field(default_factory=ArrivalLog)
    #: This process's id for the arrivals' numbering (a restarted router starts again at 0).
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    _dispatcher: Dispatcher | None = None

    def attach(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "the app's lifespan has not started"
        return self._dispatcher
