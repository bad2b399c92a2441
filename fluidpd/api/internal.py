"""The sidecar protocol: what the router, the controller and peer sidecars send each other.

SGLang-like split of one request into two halves under one integer id (its ``bootstrap_room``):
the router sends the prefill half to the prefill sidecar and the decode half to the decode
sidecar; the decode side reserves KV first and tells the prefill side, which then computes
the prefix and hands its KV over.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fluidpd.core.scheduler.worker import Pressure
from fluidpd.core.types import DrainMode, Role, RoleState

MAX_RID = (1 << 63) - 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestHalf(_Model):
    """Fields both halves carry."""

    rid: int = Field(ge=0, le=MAX_RID)
    prompt_len: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    #: Client-side arrival (router clock, UNIX seconds): TTFT deadlines count from here.
    arrival: float


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


class DecodeEvent(_Model):
    """One line of the decode half's NDJSON stream."""

    event: Literal["token", "done", "reroute", "migrated", "cancelled", "error"]
    #: Tokens generated so far (the first token counts).
    n: int = 0
    #: Token ids added since the previous event.
    ids: list[int] = Field(default_factory=list)
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


class Budget(_Model):
    worker: str
    budget: float


class Handoff(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    prefix_tokens: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class Abort(_Model):
    rid: int = Field(ge=0, le=MAX_RID)
    reason: str = "aborted"


class Released(_Model):
    released: bool


class Adopt(_Model):
    """Decode drain ``migrate``: a peer takes over an active request."""

    half: DecodeHalf
    generated: int = Field(ge=1)
    first_token_t: float


class RoleRequest(_Model):
    role: Role
    drain: DrainMode = DrainMode.WAIT
    #: Decode peers that may adopt migrated requests (drain ``migrate``).
    migrate_to: list[str] = Field(default_factory=list)


class RetireRequest(_Model):
    """Scale-in: drain this worker so that it can be deleted without dropping requests."""

    drain: DrainMode = DrainMode.WAIT
    migrate_to: list[str] = Field(default_factory=list)


class RoleStatus(_Model):
    worker: str
    role: Role
    state: RoleState
    target: Role | None = None
    since: float
    switches: int = 0
    retiring: bool = False


class PressureReport(Pressure):
    """``GET /pressure``: the scheduler's pressure plus what the sidecar adds."""

    stolen_tokens: int = 0
    switches: int = 0
    #: The last completed switch: direction and drain start / finish (UNIX seconds).
    last_switch_from: Role | None = None
    last_switch_to: Role | None = None
    last_switch_started: float = 0.0
    last_switch_finished: float = 0.0
    t: float = 0.0
