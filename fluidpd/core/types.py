"""Basic value types shared by the whole core."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def other(self) -> Role:
        return Role.DECODE if self is Role.PREFILL else Role.PREFILL


class RoleState(StrEnum):
    """FluidRole's per-worker state (paper Fig. 8)."""

    ACTIVE = "active"
    DRAIN = "drain"
    SWITCH = "switch"


class DrainMode(StrEnum):
    """How a decode worker empties itself before a D->P switch.

    ``wait`` is the paper's behaviour (active requests run to completion); ``migrate`` moves
    active requests with their KV to other decode workers so the switch finishes in about a
    second (beyond the paper).
    """

    WAIT = "wait"
    MIGRATE = "migrate"


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets in seconds."""

    ttft: float
    tpot: float

    def __post_init__(self) -> None:
        if not (self.ttft > 0 and self.tpot > 0):
            raise ValueError("SLO targets must be positive")


@dataclass(slots=True, eq=False)
class Request:
    """One inference request as the schedulers see it.

    ``rid`` is an integer so that it can double as SGLang's 63-bit ``bootstrap_room``.
    ``max_new_tokens`` is the output length the decode side runs to (benchmarks replay with
    ``ignore_eos``, so it is also the real output length); engines that stop early on EOS
    tell the decode side through ``DecodeSide.finish_early``.
    """

    rid: int
    arrival: float
    prompt_len: int
    max_new_tokens: int
    prefill_worker: str = ""
    decode_worker: str = ""
    # Set by the prefill side when the request starts: tokens run on the decode side.
    stolen: int = 0
    prefill_started: bool = False
    first_token_t: float = math.nan
    finish_t: float = math.nan
    failed: bool = False
    reassigned: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def prefix_len(self) -> int:
        return self.prompt_len - self.stolen

    @property
    def ttft(self) -> float:
        return self.first_token_t - self.arrival

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (sglang.bench_serving's definition).

        Zero for single-token outputs, which therefore always meet a TPOT target.
        """
        if self.max_new_tokens <= 1:
            return 0.0
        return (self.finish_t - self.first_token_t) / (self.max_new_tokens - 1)
