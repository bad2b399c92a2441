"""The sidecar protocol: what the router, the controller and peer sidecars send each other.

SGLang-like split of one request into two halves under one integer id (its ``bootstrap_room``):
the router sends the prefill half to the prefill sidecar and the decode half to the decode
sidecar; the decode side reserves KV first and tells the prefill side, which then computes
the prefix and hands its KV over.

Both halves carry the whole prompt as token ids (the router tokenized it; ``prompt_len`` is
``len(prompt_ids)``) and the request's ``SamplingParams``. The prefill worker computes the
prefix ``prompt_ids[:p]``; when ``p`` is the whole prompt it also samples the first output
token, which travels in the ``Handoff``. The decode worker runs the stolen suffix
``prompt_ids[p:]`` (if any) on top of the imported KV, samples the rest, detokenizes
incrementally and stops the request (EOS, stop ids, stop strings, ``max_new_tokens``); its
NDJSON stream of ``DecodeEvent`` lines carries the token ids, their text and, when asked,
their log-probabilities.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fluidpd.api.sampling import FinishReason, SampledToken, SamplingParams
from fluidpd.core.rolestate import RoleStateMachine
from fluidpd.core.scheduler.worker import Pressure
from fluidpd.core.types import DrainMode, Role, RoleState

#: JSON's exact integers (RFC 8259 section 6): a larger one is rounded by many clients' parsers.
MAX_RID = (1 << 53) - 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestHalf(_Model):
    """Fields both halves carry."""

    rid: int = Field(ge=0, le=MAX_RID)
    #: The whole prompt's token ids (the router checked them against the vocabulary).
    prompt_ids: list[int] = Field(min_length=1)
    sampling: SamplingParams
    #: Client-side arrival (router clock, UNIX seconds): TTFT deadlines count from here.
    arrival: float

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens


class PrefillHalf(RequestHalf):
    decode_worker: str
    decode_url: str


class DecodeHalf(RequestHalf):
    prefill_worker: str
    prefill_url: str


class PrefillOutcome(_Model):
    """How the prefill half ended (the long-poll answer of ``POST /v1/internal/prefill``)."""

    status: Literal["done", "reroute", "cancelled"]
    stolen: int = 0
    detail: str = ""


class TopLogprob(_Model):
    """A token and its log-probability, with its text as OpenAI reports it."""

    id: int
    #: The token's text (its bytes decoded as UTF-8, invalid bytes replaced).
    token: str
    #: The token's exact bytes (a token can hold part of a multi-byte character).
    bytes: list[int]
    logprob: float


class TokenLogprob(TopLogprob):
    """An output token's log-probability and the most likely alternatives at its position."""

    top: list[TopLogprob] = Field(default_factory=list)


class DecodeEvent(_Model):
    """One line of the decode half's NDJSON stream."""

    event: Literal["token", "done", "reroute", "migrated", "cancelled", "error"]
    #: Tokens generated so far (the first token counts).
    n: int = 0
    #: Token ids added since the previous event (EOS and stop ids included: they count as
    #: generated tokens in ``usage``).
    ids: list[int] = Field(default_factory=list)
    #: Output text added since the previous event. Text that could be the start of a stop
    #: string is held back until it is not (or the request ends), a stop string and what
    #: follows it are never sent, and special tokens have no text; the concatenation of a
    #: request's ``text`` is its whole output text.
    text: str = ""
    #: One entry per id in ``ids`` when the request asked for log-probabilities.
    logprobs: list[TokenLogprob] | None = None
    #: On ``done``: why the request ended.
    finish_reason: FinishReason | None = None
    t: float = 0.0
    url: str = ""
    detail: str = ""


class Reserved(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    decode_worker: str
    t: float
    #: The decode worker's per-prefill stealing budget at reservation time (eq. 17).
    budget: float = 0.0
    #: Where the prefix KV must be written (transports that move bytes; empty for ``sim``).
    kv_session: str = ""
    kv_addr: int = 0
    kv_nbytes: int = 0


class SuffixCommit(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    tokens: int = Field(ge=1)
    #: Prompt tokens before the suffix (its extend attends over them; 0 when not told).
    prefix: int = Field(default=0, ge=0)


class Budget(_Model):
    worker: str
    budget: float


class Handoff(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    prefix_tokens: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    #: The first output token, sampled by the prefill worker when it computed the whole
    #: prompt (``prefix_tokens == len(prompt_ids)``); None when a suffix runs on decode.
    first: SampledToken | None = None


class Abort(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    reason: str = "aborted"
    #: Cancel a decode half only if its prefill hand-off has not arrived: one that has its KV
    #: goes on (the router's abort after a prefill half that ended badly races the hand-off).
    unless_started: bool = False


class Released(_Model):
    released: bool


class FluidTokenSetting(_Model):
    """An sglang worker's FluidToken override, changed at run time (``PUT /admin/fluidtoken``)
    as at start (``--force-steal``)."""

    #: Every prompt this worker starts prefilling from now on runs with stealing ratio beta
    #: (the decode worker computes its last beta share), whatever FluidToken would decide;
    #: null: FluidToken decides again (with FluidToken off, prompts run whole on prefill).
    force_steal: float | None = Field(ge=0.0, le=1.0)


class Adopt(_Model):
    """Decode drain ``migrate``: a peer takes over an active request."""

    half: DecodeHalf
    generated: int = Field(ge=1)
    #: The ids generated so far (``generated`` of them): the adopter continues the request's
    #: penalties, detokenization and stop-string matching from them.
    output_ids: list[int]
    first_token_t: float
    #: The source offers its KV to be read in place (its transport's ``peer_view``): a target
    #: whose transport can read it reserves no arena room, answers ``kv_pull``, and loads the
    #: KV during ``activate``. Otherwise the target reserves room and the source writes into it.
    kv_pull: bool = False

    @model_validator(mode="after")
    def _lengths(self) -> Adopt:
        if len(self.output_ids) != self.generated:
            raise ValueError(f"output_ids: {len(self.output_ids)} ids for {self.generated}")
        return self


class Activate(_Model):
    """Drain ``migrate``: an adopted request's KV is ready, and the target takes it over. With
    ``kv_nbytes`` the target reads the KV in the source's staging slot (``kv_session`` and
    ``kv_addr`` there) before it answers; the source frees the slot after the answer."""

    rid: int = Field(ge=0, le=MAX_RID)
    reason: str = "migrated"
    kv_session: str | None = Field(default=None, max_length=4096)
    kv_addr: int = Field(default=0, ge=0)
    kv_nbytes: int = Field(default=0, ge=0)


class DrainReport(_Model):
    """Where the last decode drain ``migrate`` spent its time (``GET /role``): seconds from the
    drain's start, summed over requests for the per-request phases."""

    #: Requests moved to a peer / finished here / adoptions a peer refused (retried in a
    #: later round, except those refused for good: HTTP 400) / moves that failed.
    moved: int = 0
    finished_here: int = 0
    refused: int = 0
    failed: int = 0
    #: Times the plan was made (each after a decode step of the requests still here).
    rounds: int = 0
    #: Drain start to the first adoption sent; to the last request out of the batch; to the
    #: last request taken over by its peer (its KV loaded there); to the switch done.
    first_adopt_s: float = 0.0
    last_detached_s: float = 0.0
    last_activated_s: float = 0.0
    drain_s: float = 0.0
    #: Summed per-request phases: adoption round trips, waiting for staging room and exporting
    #: the KV (engine job), the transport's copy (push only), the peer's activation (with pull:
    #: its load of the KV).
    adopt_s: float = 0.0
    export_s: float = 0.0
    send_s: float = 0.0
    activate_s: float = 0.0
    #: The slowest single move (export to activated).
    max_move_s: float = 0.0
    #: Bytes of KV moved; whether they were pulled by the peers.
    kv_bytes: int = 0
    pulled: bool = False


class RoleRequest(_Model):
    role: Role
    drain: DrainMode = DrainMode.WAIT
    #: Decode peers that may adopt migrated requests (drain ``migrate``).
    migrate_to: list[str] = Field(default_factory=list)


class RetireRequest(_Model):
    """Scale-in: drain this worker so that it can be deleted without dropping requests."""

    drain: DrainMode = DrainMode.WAIT
    migrate_to: list[str] = Field(default_factory=list)
    #: A retiring worker that is still there this long after the call returns to service by
    #: itself (its scale-in was abandoned); 0: never.
    return_after_s: float = Field(default=600.0, ge=0.0, le=86_400.0)


class RoleStatus(_Model):
    worker: str
    role: Role
    state: RoleState
    target: Role | None = None
    since: float
    switches: int = 0
    retiring: bool = False
    last_drain: DrainReport | None = None

    @classmethod
    def of(
        cls,
        worker: str,
        sm: RoleStateMachine,
        switches: int,
        last_drain: DrainReport | None = None,
    ) -> RoleStatus:
        """A worker's answer from its role state machine (every engine's sidecar)."""
        return cls(
            worker=worker,
            role=sm.role,
            state=sm.state,
            target=sm.target,
            since=sm.since,
            switches=switches,
            retiring=sm.retiring,
            last_drain=last_drain,
        )


class PressureReport(_Model):
    """``GET /pressure``: the scheduler's :class:`~fluidpd.core.scheduler.worker.Pressure`
    (the same fields, checked by a test) plus what the sidecar adds."""

    worker: str
    role: Role
    state: RoleState
    target: Role | None = None
    queue_ppi: float
    #: PPI with decode-admission waiting excluded; what FluidRole reads.
    attributable_ppi: float
    queue_len: int
    dpi_load: float
    dpi_adm: float
    batch: int
    kv_used: int
    kv_reserved: int
    kv_capacity: int
    steal_budget: float
    drain_cost: float
    #: Nothing left in flight on this worker (what a retiring worker waits for).
    drained: bool = False
    retiring: bool = False
    #: A prefill worker's measured busy fraction over the last 10 s (null: not measured).
    busy: float | None = None
    #: Requests waiting for KV room on a decode worker (SGLang's prealloc queue).
    kv_waiting: int = 0
    stolen_tokens: int = 0
    switches: int = 0
    #: The last completed switch: direction and drain start / finish (UNIX seconds).
    last_switch_from: Role | None = None
    last_switch_to: Role | None = None
    last_switch_started: float = 0.0
    last_switch_finished: float = 0.0
    t: float = 0.0

    @classmethod
    def of(cls, pressure: Pressure, **sidecar: object) -> PressureReport:
        """The wire form of the scheduler's pressure, with the sidecar's own fields."""
        return cls.model_validate({**dataclasses.asdict(pressure), **sidecar})
