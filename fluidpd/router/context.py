"""What the router's route modules share: settings, tokenizer, worker set, metrics and the
dispatcher (made when the app starts, since it needs the running loop's HTTP session)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    _dispatcher: Dispatcher | None = None

    def attach(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "the app's lifespan has not started"
        return self._dispatcher
