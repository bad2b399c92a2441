"""One worker: both sides, one role at a time, switched in place (FluidRole, §IV-C1)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fluidpd.core.fluidrole import WorkerSignals
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.predictors import FloatArray, OnlineCalibrator
from fluidpd.core.profile import Profile
from fluidpd.core.rolestate import RoleStateMachine
from fluidpd.core.scheduler.decode import DecodeBatch, DecodeSide
from fluidpd.core.scheduler.messages import Message
from fluidpd.core.scheduler.prefill import BudgetSource, PrefillBatch, PrefillSide
from fluidpd.core.types import SLO, DrainMode, Role, RoleState

Batch = PrefillBatch | DecodeBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """A worker's pressure (the sidecar serves it, extended, as the wire type
    ``fluidpd.api.internal.PressureReport``; the core holds no wire types)."""

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
    #: Fraction of the last ``BUSY_WINDOW_S`` (since the role began, if later) this prefill
    #: worker spent in prefill steps, measured (``BusyWindow``); None when not measured.
    busy: float | None = None
    #: Requests waiting for KV room on a decode worker (the prealloc queue): the load past a
    #: full DPI_adm, which cannot exceed 1.
    kv_waiting: int = 0

    def signals(self) -> WorkerSignals:
        return WorkerSignals(
            self.worker,
            self.role,
            self.state,
            self.attributable_ppi,
            self.dpi_load,
            self.dpi_adm,
            self.drain_cost,
            self.busy,
            self.kv_waiting,
        )


#: Seconds over which a prefill worker's busy fraction is measured (FluidRole's PPI window).
BUSY_WINDOW_S = 10.0


@dataclass(slots=True)
class BusyWindow:
    """The measured time a worker spent in steps over the last ``window_s`` (issue #14).

    What a prefill pool really does with its time, as opposed to what its deadlines say: a
    queue that misses deadlines (PPI-bar above 1) on workers that are idle part of the time is
    not short of prefill capacity, however slow the host (or whatever delayed the requests
    before they reached it). Times are the caller's; steps are (end time, measured seconds).
    """

    window_s: float = BUSY_WINDOW_S
    _steps: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, end: float, seconds: float) -> None:
        self._steps.append((end, max(0.0, seconds)))

    def busy(self, now: float, since: float = float("-inf")) -> float:
        """Fraction of ``[max(now - window_s, since), now]`` covered by the steps (at most 1)."""
        start = max(now - self.window_s, since)
        steps = self._steps
        while steps and steps[0][0] <= now - self.window_s:
            steps.popleft()
        span = now - start
        if span <= 0:
            return 0.0
        covered = sum(max(0.0, min(end, now) - max(end - sec, start)) for end, sec in steps)
        return min(1.0, covered / span)


@dataclass(slots=True)
class Worker:
    """A serving worker. The object (and whatever engine a harness hangs on it) survives every
    role switch; only which side is scheduling changes.

    ``adaptive`` turns on online recalibration of the predictors from measured step times.
    """

    worker_id: str
    role_sm: RoleStateMachine
    prefill: PrefillSide
    decode: DecodeSide
    calibrator: OnlineCalibrator
    adaptive: bool = False
    outbox: list[Message] = field(default_factory=list)
    #: Measured prefill steps, for the busy fraction the pressure reports.
    prefill_steps: BusyWindow = field(default_factory=BusyWindow)

    @classmethod
    def create(
        cls,
        worker_id: str,
        role: Role,
        profile: Profile,
        slo: SLO,
        token_cfg: FluidTokenConfig,
        adaptive: bool = False,
        now: float = 0.0,
    ) -> Worker:
        outbox: list[Message] = []
        pre, sfx, dec = (
            profile.prefill_predictor(),
            profile.suffix_predictor(),
            profile.decode_predictor(),
        )
        transfer = profile.transfer_model()
        prefill = PrefillSide(
            worker_id, slo, pre, sfx, profile.kv.bytes_per_token, transfer, token_cfg, outbox
        )
        decode = DecodeSide(
            worker_id,
            slo,
            dec,
            sfx,
            transfer,
            profile.kv.capacity_tokens,
            profile.kv.bytes_per_token,
            profile.max_running_requests,
            profile.kv.reserve_output_clip,
            token_cfg,
            outbox,
        )
        return cls(
            worker_id,
            RoleStateMachine(role, since=now),
            prefill,
            decode,
            OnlineCalibrator(pre, sfx, dec),
            adaptive,
            outbox,
        )

    @property
    def role(self) -> Role:
        return self.role_sm.role

    @property
    def state(self) -> RoleState:
        return self.role_sm.state

    @property
    def accepting(self) -> bool:
        return self.role_sm.accepting

    def take_outbox(self) -> list[Message]:
        out = list(self.outbox)
        self.outbox.clear()
        return out

    # -- scheduling ---------------------------------------------------------------------------
    def next_batch(
        self, now: float, budgets: BudgetSource | None = None, max_iterations: int = 1
    ) -> Batch | None:
        """The next step; ``max_iterations`` > 1 lets a decode step span several iterations of
        an unchanged batch (simulators; see ``DecodeSide.next_batch``)."""
        if self.state is RoleState.SWITCH:
            return None
        if self.role is Role.PREFILL:
            return self.prefill.next_batch(now, budgets)
        return self.decode.next_batch(now, max_iterations)

    def finish_batch(
        self,
        batch: Batch,
        now: float,
        measured_s: float,
        iteration_s: FloatArray | None = None,
    ) -> None:
        if isinstance(batch, PrefillBatch):
            self.prefill.finish_batch(batch, now)
            self.prefill_steps.add(now, measured_s)
            if self.adaptive and batch.prefix_tokens > 0:
                self.prefill.prefill = self.calibrator.observe_prefill(
                    batch.prefix_tokens, measured_s
                )
            return
        self.decode.finish_batch(batch, now, measured_s, iteration_s)
        if not self.adaptive or batch.iterations > 1:
            return
        if batch.batch and not batch.suffix:
            self.decode.decode = self.calibrator.observe_decode(
                batch.batch, batch.context, measured_s
            )
        elif len(batch.suffix) == 1:
            # The extend's share of a mixed iteration: the rest is a regular decode step.
            plain = self.decode.decode.time(batch.batch, batch.context) if batch.batch else 0.0
            req = batch.suffix[0]
            sfx = self.calibrator.observe_suffix(
                req.stolen, measured_s - plain, req.prompt_len - req.stolen
            )
            self.decode.suffix = self.prefill.suffix = sfx

    # -- FluidRole ----------------------------------------------------------------------------
    def begin_switch(self, target: Role, now: float, drain: DrainMode = DrainMode.WAIT) -> None:
        """Active -> Drain: stop taking work, hand back what has not started."""
        self.role_sm.begin_drain(target, now)
        if self.role is Role.PREFILL:
            self.prefill.begin_drain()
        else:
            self.decode.begin_drain(drain is DrainMode.MIGRATE)

    def begin_retire(self, now: float, drain: DrainMode = DrainMode.WAIT) -> None:
        """Active -> Drain for removal (scale-in): hand back what has not started, finish (or,
        for decode with ``migrate``, move away) what is in flight."""
        self.role_sm.begin_retire(now)
        if self.role is Role.PREFILL:
            self.prefill.begin_drain()
        else:
            self.decode.begin_drain(drain is DrainMode.MIGRATE)

    def cancel_retire(self, now: float) -> None:
        """Back to Active in the current role: the retirement was called off (the side takes
        new work again; what was handed back was re-paired elsewhere)."""
        self.role_sm.cancel_retire(now)
        if self.role is Role.DECODE:
            self.decode.admitting = True
            self.decode.migrate_on_drain = False

    @property
    def retiring(self) -> bool:
        return self.role_sm.retiring

    @property
    def drained(self) -> bool:
        side = self.prefill if self.role is Role.PREFILL else self.decode
        return side.drained

    def try_enter_switch(self, now: float) -> bool:
        """Drain -> Switch once the old role's work is done (never for a retiring worker)."""
        if self.state is RoleState.DRAIN and not self.retiring and self.drained:
            self.role_sm.begin_switch(now)
            return True
        return False

    def complete_switch(self, now: float) -> Role:
        """Switch -> Active in the new role; the new side starts clean and accepting."""
        role = self.role_sm.complete(now)
        if role is Role.DECODE:
            self.decode.admitting = True
            self.decode.migrate_on_drain = False
        return role

    def switch_overhead(self, profile: Profile) -> float:
        """Engine-side seconds to flip into the target role once drained (from the profile)."""
        target = self.role_sm.target
        ms = profile.switch.to_decode_ms if target is Role.DECODE else profile.switch.to_prefill_ms
        return ms * 1e-3

    # -- signals ------------------------------------------------------------------------------
    def pressure(self, now: float, n_prefill: int = 1) -> Pressure:
        is_prefill = self.role is Role.PREFILL
        d = self.decode
        return Pressure(
            worker=self.worker_id,
            role=self.role,
            state=self.state,
            target=self.role_sm.target,
            queue_ppi=self.prefill.queue_ppi(now) if is_prefill else 0.0,
            attributable_ppi=self.prefill.attributable_ppi(now) if is_prefill else 0.0,
            queue_len=self.prefill.queue_len if is_prefill else len(d.prealloc),
            dpi_load=0.0 if is_prefill else d.dpi_load(),
            dpi_adm=0.0 if is_prefill else d.dpi_adm(),
            batch=0 if is_prefill else len(d.active),
            kv_used=0 if is_prefill else d.context,
            kv_reserved=0 if is_prefill else max(0, d.committed - d.context),
            kv_capacity=d.kv_capacity,
            steal_budget=0.0 if is_prefill else d.steal_budget(n_prefill),
            drain_cost=self.prefill.drain_cost(now) if is_prefill else d.drain_cost(),
            drained=self.drained,
            retiring=self.retiring,
            busy=self.prefill_steps.busy(now, self.role_sm.since) if is_prefill else None,
            kv_waiting=0 if is_prefill else len(d.prealloc),
        )
