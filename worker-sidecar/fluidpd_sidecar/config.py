"""What a sidecar is told at start (``fluidpd sidecar``'s options)."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO, Role
from fluidpd.modeldir.model_dir import ModelDir


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    worker_id: str
    role: Role
    url: str
    profile: Profile
    slo: SLO
    #: What is served: its tokenizer detokenizes, its EOS ids stop, its vocabulary bounds ids.
    model: ModelDir
    token_cfg: FluidTokenConfig = FluidTokenConfig()
    adaptive: bool = False
    admin_token: str | None = None
    #: Tokens are streamed to the router at most this often (first and last token at once).
    stream_interval_s: float = 0.05
    #: While a prefill queue is under pressure, paired decode budgets are refreshed this often.
    budget_refresh_s: float = 0.1
    #: A prefill half whose decode peer never reserves KV is given up after this long
    #: (SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT plays the same role).
    bootstrap_timeout_s: float = 300.0
    #: Testing knob: every prefill runs with this stealing ratio (``PrefillSide.forced_steal``).
    force_steal: float | None = None
    #: A migrated-in request that ended before the router re-attached to its event stream
    #: keeps its events this long for the router to read (then it is dropped).
    unclaimed_timeout_s: float = 60.0

    @property
    def context_limit(self) -> int:
        return self.model.context_limit(self.profile.context_limit)
