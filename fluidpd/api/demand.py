"""The demand a router exports to the FluidRole controller (``GET /admin/arrivals``).

The predictive switch rule forecasts each phase's load from what arrived over the last minute
(``fluidpd.core.role_control``): every client request's arrival time, prompt length and output
estimate (``max_new_tokens``). The router numbers them as they arrive (``ArrivalLog``); the
controller asks for those after the ``next`` of its previous answer, so each arrival reaches
it once, in order, and a gap (the router's log forgot some, or restarted) is counted, never
guessed at.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fluidpd.core.role_control import ArrivalBatch


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArrivalRecord(_Model):
    """One client request as the router admitted it."""

    #: Arrival (router clock, UNIX seconds).
    t: float
    #: Prompt tokens, and output tokens asked for (``max_new_tokens``).
    prompt: int = Field(ge=1)
    output: int = Field(ge=0)


class ArrivalsReport(_Model):
    """The arrivals after the reader's cursor (``after``), oldest first."""

    #: The router process's id: a restarted router numbers its arrivals from 0 again, so a
    #: cursor is only good with the epoch it came with.
    epoch: str
    #: When the router answered (router clock, UNIX seconds): the reader puts the arrival
    #: times on its own clock with it.
    t: float
    #: The number of the next arrival: the reader's next ``after``.
    next: int = Field(ge=0)
    #: Arrivals after the cursor that this answer cannot give (forgotten by the router's
    #: bounded log, or beyond one answer's size: the newest are kept).
    dropped: int = Field(ge=0)
    arrivals: list[ArrivalRecord]

    @classmethod
    def of(cls, batch: ArrivalBatch, epoch: str, t: float) -> ArrivalsReport:
        return cls(
            epoch=epoch,
            t=t,
            next=batch.next,
            dropped=batch.dropped,
            arrivals=[
                ArrivalRecord(t=a.t, prompt=a.prompt, output=a.output) for a in batch.arrivals
            ],
        )
