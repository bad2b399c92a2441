"""Discrete-event simulator: the core's workers, policies and pairing in virtual time.

The event loop owns only time, the engine's step durations and message delivery; every
scheduling and control decision is made by the same core objects the live sidecars run
(``fluidpd.core``). Step durations come from the profile's predictors, optionally scaled by a
drift factor (the engine is slower than the profile says) and multiplicative log-normal noise,
so that the workers' own predictors are not trivially exact.

Decode iterations between changes of a batch's membership run as one event (a *span*): the
iteration times of an unchanged batch follow eq. (13) with a context that grows by one token
per member per iteration, so the span's iteration end times are known up front. Anything that
would change the batch (a hand-off, a migration, a cancel, a drain) first cuts the span at the
iteration in progress, and anything that reads the decode side's state (the controller, the
steal budgets) first advances it to the last finished iteration, so that every decision sees
exactly what a per-iteration simulation would. Event counts then scale with requests, not
with output length or context length.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from fluidpd.core.fluidrole import FluidRoleConfig, SwitchDecision
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.migration import plan_migration
from fluidpd.core.pairing import LeastLoadedPairing, Pairing, RandomPairing, RoundRobinPairing
from fluidpd.core.profile import Profile
from fluidpd.core.repair import drain_releases_reserved, release_asks
from fluidpd.core.role_control import RoleControl
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.messages import (
    Finished,
    FirstToken,
    Handoff,
    Message,
    Reroute,
    Reserved,
    SuffixCommitted,
)
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.scheduler.worker import Batch, Worker
from fluidpd.core.step_times import StepTimes
from fluidpd.core.types import SLO, DrainMode, Request, Role, RoleState
from fluidpd.sim.policies import AutoscaleConfig, Mechanisms
from fluidpd.sim.workloads import Workload

#: Longest run of decode iterations simulated as one event (bounds the per-event arrays).
MAX_SPAN = 4096

# Event kinds (ints keep heap tuples cheap to compare).
(
    _ARRIVE, _BATCH_DONE, _HANDOFF_DONE, _MIGRATE_DONE, _SWITCH_DONE, _CONTROL, _SCALE_READY,
    _BOOKING_DUE,
) = range(8)  # fmt: skip


class SimulationError(RuntimeError):
    """An invariant of the simulation broke (a bug, never a user error)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    profile: Profile
    slo: SLO
    n_prefill: int
    n_decode: int
    mechanisms: Mechanisms = Mechanisms()
    token_cfg: FluidTokenConfig = FluidTokenConfig()
    role_cfg: FluidRoleConfig = FluidRoleConfig()
    autoscale_cfg: AutoscaleConfig = AutoscaleConfig()
    pairing: str = "round-robin"
    #: A request still waiting for its first token after this long is cancelled (SGLang).
    timeout_s: float = 60.0
    #: Sigma of the mean-one log-normal noise on every step time (0 = exact).
    noise: float = 0.0
    #: True engine time / profile prediction (the engine drifted from its calibration).
    drift: float = 1.0
    #: Online recalibration of the workers' predictors (adaptive mode).
    adaptive: bool = False
    seed: int = 0


@dataclass(slots=True)
class RoleSwitch:
    t: float
    worker: str
    source: str
    target: str
    drain_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "t": round(self.t, 3),
            "worker": self.worker,
            "from": self.source,
            "to": self.target,
            "drain_s": round(self.drain_s, 3),
        }


@dataclass(slots=True)
class TimeSeries:
    t: list[float] = field(default_factory=list)
    n_prefill: list[int] = field(default_factory=list)
    n_decode: list[int] = field(default_factory=list)
    prefill_queue: list[int] = field(default_factory=list)
    stolen_tokens: list[int] = field(default_factory=list)
    ppi_bar: list[float] = field(default_factory=list)
    dpi_load_bar: list[float] = field(default_factory=list)
    dpi_adm_bar: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[float] | list[int]]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class SimResult:
    requests: list[Request]
    switches: list[RoleSwitch]
    series: TimeSeries
    stolen_tokens: int
    scale_outs: list[dict[str, object]]
    end_time: float
    events: int
    #: Mean relative error of the workers' own step-time predictions, per batch kind.
    predictor_mre: dict[str, float]


def prompt_normal(seed: int) -> Callable[[int, int], float]:
    """A standard normal draw per (request id, dispatch) for run ``seed``, the same whatever
    was drawn before it (``StepTimes.prompt_factor``). Seeded by one integer, not a hash of a
    tuple, so that every Python version draws the same numbers."""

    def draw(rid: int, attempt: int) -> float:
        return random.Random((abs(seed) << 72) | (rid << 8) | min(attempt, 255)).gauss(0.0, 1.0)

    return draw


class Simulator:
    """One simulated deployment serving one workload."""

    def __init__(self, workload: Workload, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.workload = workload
        self.profile = cfg.profile
        self.now = 0.0
        self._seq = itertools.count()
        self._events: list[tuple[float, int, int, object, object]] = []
        self._rng = random.Random(cfg.seed)
        # Span noise is drawn as vectors; a separate stream keeps per-step draws reproducible.
        self._span_rng = np.random.default_rng(cfg.seed)
        self._max_span = 1 if cfg.adaptive else MAX_SPAN
        # Keyed: a prompt's prefill noise is its own, so that policies compare on one draw.
        self._true_times = StepTimes(
            cfg.profile, cfg.noise, cfg.drift, self._rng, prompt_normal(cfg.seed)
        )
        self._transfer = cfg.profile.transfer_model()
        token_cfg = replace(cfg.token_cfg, enabled=cfg.mechanisms.fluidtoken)
        self._token_cfg = token_cfg
        self.workers: dict[str, Worker] = {}
        for i in range(cfg.n_prefill + cfg.n_decode):
            role = Role.PREFILL if i < cfg.n_prefill else Role.DECODE
            self._add_worker(role)
        self.busy: dict[str, Batch] = {}
        #: A running span's per-iteration durations and absolute end times.
        self._span_steps: dict[str, np.ndarray] = {}
        self._span_ends: dict[str, np.ndarray] = {}
        #: The BATCH_DONE event that is current per worker (a cut span leaves a stale one).
        self._ticket: dict[str, int] = {}
        self.pairing: Pairing = self._make_pairing(cfg.pairing)
        # The policy also runs (disabled) under other mechanisms: its pool pressure feeds the
        # time series and the autoscale baseline. There no switch follows from its forecast,
        # so it is fed no arrivals and forecasts nothing (most of a replay's control step).
        # The same policy and demand glue as the live controller's (``RoleControl``).
        self.role_control = RoleControl.create(
            replace(cfg.role_cfg, enabled=cfg.mechanisms.fluidrole),
            cfg.profile,
            cfg.slo,
            fed=cfg.mechanisms.fluidrole,
        )
        self.role_policy = self.role_control.policy
        self._drain_started: dict[str, float] = {}
        self.switches: list[RoleSwitch] = []
        self.scale_outs: list[dict[str, object]] = []
        self._scale_pending = False
        self._pressured_since: dict[Role, float] = {}
        self.series = TimeSeries()
        self._stolen_seen = 0
        self.requests: list[Request] = [
            Request(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(
                zip(workload.arrivals, workload.prompt_lens, workload.output_lens, strict=True)
            )
        ]
        self._waiting_first: deque[Request] = deque()
        self._done = 0
        self._ended: set[int] = set()
        self._events_handled = 0
        self._pred_err: dict[str, list[float]] = {}

    # -- setup --------------------------------------------------------------------------------
    def _add_worker(self, role: Role) -> Worker:
        wid = f"w{len(self.workers)}"
        w = Worker.create(
            wid, role, self.profile, self.cfg.slo, self._token_cfg, self.cfg.adaptive, self.now
        )
        self.workers[wid] = w
        return w

    def _make_pairing(self, name: str) -> Pairing:
        if name == "round-robin":
            return RoundRobinPairing()
        if name == "least-loaded":
            return LeastLoadedPairing(
                prefill_backlog=lambda p: self.workers[p].prefill.queued_work(self.now),
                decode_free_kv=lambda d: float(self._synced(d).decode.allocatable()),
            )
        if name == "random":
            # Its own stream: drawing pairs must not shift the noise the policies compare on.
            return RandomPairing(random.Random(f"pairing:{self.cfg.seed}").randrange)
        raise ValueError(f"unknown pairing {name!r}")

    def _push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, a, b))

    def pool(self, role: Role) -> list[str]:
        return [wid for wid, w in self.workers.items() if w.role is role and w.accepting]

    # -- engine timing ------------------------------------------------------------------------
    def _span_steps_of(self, batch: DecodeBatch) -> np.ndarray:
        """True durations of a span's iterations: eq. (13) per iteration times the noise."""
        return self._true_times.span(batch, self._span_rng)

    def _duration(self, batch: Batch) -> float:
        return self._true_times.duration(batch)

    # -- driving workers ----------------------------------------------------------------------
    def _budgets(self, decode_ids: Sequence[str]) -> np.ndarray:
        n_prefill = len(self.pool(Role.PREFILL))
        return np.array(
            [
                self._synced(d).decode.steal_budget(n_prefill)
                if self.workers[d].role is Role.DECODE
                else 0.0
                for d in decode_ids
            ],
            dtype=np.float64,
        )

    def _kick(self, w: Worker) -> None:
        if w.worker_id in self.busy:
            return
        budgets: Callable[[Sequence[str]], np.ndarray] | None = (
            self._budgets if self._token_cfg.enabled else None
        )
        # A worker draining by migration moves its streams out at its next iteration boundary
        # (``_after_change``), so it never runs a span: a stream handed to it mid-drain
        # decoded to its end in one.
        draining = w.state is RoleState.DRAIN and w.decode.migrate_on_drain
        batch = w.next_batch(self.now, budgets, 1 if draining else self._max_span)
        if batch is not None:
            wid = w.worker_id
            self.busy[wid] = batch
            if isinstance(batch, DecodeBatch) and batch.iterations > 1:
                steps = self._span_steps_of(batch)
                self._span_steps[wid] = steps
                self._span_ends[wid] = self.now + np.cumsum(steps)
                self._schedule_done(wid, float(self._span_ends[wid][-1]))
            else:
                self._schedule_done(wid, self.now + self._duration(batch))
        self._flush(w)

    def _schedule_done(self, wid: str, t: float) -> None:
        ticket = next(self._seq)
        self._ticket[wid] = ticket
        self._push(t, _BATCH_DONE, wid, ticket)

    # -- decode spans ---------------------------------------------------------------------------
    def _sync(self, w: Worker) -> None:
        """Advance a running span to its last finished iteration (state reads see the truth)."""
        wid = w.worker_id
        batch = self.busy.get(wid)
        ends = self._span_ends.get(wid)
        if ends is None or not isinstance(batch, DecodeBatch) or batch.iterations == 1:
            return
        done = min(int(np.searchsorted(ends, self.now, side="right")), batch.iterations - 1)
        if done == 0:
            return
        steps = self._span_steps[wid]
        head_s = steps[:done]
        predicted = self.workers[wid].decode.decode.span_time(batch.batch, batch.context, done)
        self._record_error("decode", predicted, float(head_s.sum()), done)
        rest = w.decode.split(batch, done, float(ends[done - 1]), head_s)
        self.busy[wid] = rest
        self._span_steps[wid] = steps[done:]
        self._span_ends[wid] = ends[done:]
        self._flush(w)

    def _synced(self, wid: str) -> Worker:
        w = self.workers[wid]
        self._sync(w)
        return w

    def _interrupt(self, w: Worker) -> None:
        """Cut a running span at the iteration in progress: its membership is about to change,
        which takes effect at the next iteration boundary."""
        self._sync(w)
        wid = w.worker_id
        batch = self.busy.get(wid)
        if not isinstance(batch, DecodeBatch) or batch.iterations == 1:
            return
        self.busy[wid] = w.decode.truncate(batch)
        self._span_steps[wid] = self._span_steps[wid][:1]
        self._span_ends[wid] = self._span_ends[wid][:1]
        self._schedule_done(wid, float(self._span_ends[wid][0]))

    def _record_error(self, kind: str, predicted: float, measured: float, weight: int) -> None:
        """Mean relative error of the workers' predictions, weighted by iterations."""
        if measured > 0:
            err = self._pred_err.setdefault(kind, [0.0, 0])
            err[0] += weight * abs(predicted - measured) / measured
            err[1] += weight

    def _flush(self, w: Worker) -> None:
        while w.outbox:
            for msg in w.take_outbox():
                self._deliver(msg)

    def _deliver(self, msg: Message) -> None:
        if isinstance(msg, Reserved):
            p = self.workers[msg.prefill_worker]
            if p.role is Role.PREFILL and p.prefill.reserved(msg.rid, self.now):
                self._kick(p)
        elif isinstance(msg, SuffixCommitted):
            self.workers[msg.decode_worker].decode.suffix_committed(msg.rid, msg.tokens)
        elif isinstance(msg, Handoff):
            t = self.now + self._transfer.time(msg.nbytes)
            self._push(t, _HANDOFF_DONE, msg, None)
        elif isinstance(msg, FirstToken):
            req = self.requests[msg.rid]
            if req.ttft > self.cfg.timeout_s:
                self._fail(req)
        elif isinstance(msg, Finished):
            req = self.requests[msg.rid]
            if not req.failed:  # a single-token request can fail on its (late) first token
                self._end(req)
        elif isinstance(msg, Reroute):
            self._reroute(msg.request, msg.from_worker)

    def _end(self, req: Request) -> None:
        if req.rid in self._ended:
            raise SimulationError(f"request {req.rid} ended twice")
        self._ended.add(req.rid)
        self._done += 1

    def _fail(self, req: Request) -> None:
        """Cancel a request everywhere (SGLang aborts it after the first-token timeout)."""
        if req.failed or req.rid in self._ended:
            return
        req.failed = True
        req.finish_t = math.nan  # a single-token request may already carry one
        for wid in {req.prefill_worker, req.decode_worker}:
            w = self.workers.get(wid)
            if w is None:
                continue
            self._interrupt(w)
            w.prefill.cancel(req.rid)
            w.decode.cancel(req.rid)
            self._flush(w)
            self._after_change(w)
        self._end(req)

    def _dispatch(self, req: Request) -> None:
        p_id, d_id = self.pairing.choose(self.pool(Role.PREFILL), self.pool(Role.DECODE))
        req.stolen = 0
        req.prefill_started = False
        p, d = self.workers[p_id], self.workers[d_id]
        p.prefill.add(req)
        req.decode_worker = d_id
        d.decode.add(req, self.now)
        self._flush(d)
        self._kick(p)

    def _reroute(self, req: Request, source: str) -> None:
        """Abort both halves of a not-started request and pair it again (DESIGN: aborts reach
        both halves)."""
        if req.failed:
            return
        for wid in (req.prefill_worker, req.decode_worker):
            if wid != source:
                w = self.workers[wid]
                w.prefill.cancel(req.rid)
                w.decode.cancel(req.rid)
                self._flush(w)
        req.reassigned += 1
        self._dispatch(req)

    def _after_change(self, w: Worker) -> None:
        """Advance a draining worker towards its switch."""
        if w.state is RoleState.DRAIN and w.worker_id not in self.busy:
            if w.role is Role.DECODE and w.decode.migrate_on_drain:
                self._migrate_out(w)
            if w.try_enter_switch(self.now):
                self._push(self.now + w.switch_overhead(self.profile), _SWITCH_DONE, w.worker_id)

    def _migrate_out(self, w: Worker) -> None:
        """Drain mode ``migrate``: move active requests with their KV to other decode workers."""
        d = w.decode
        peers = [self.workers[x].decode.room(x) for x in self.pool(Role.DECODE)]
        plan = plan_migration(d.migrants(self._transfer.time), peers, d.step_s())
        for rid, peer in plan.asks:
            t = self.workers[peer]
            if t.decode.adopt(d.active[rid].req, d.active[rid].generated(d.iteration), self.now):
                req, generated = d.detach(rid)
                nbytes = d.migration_bytes(req, generated)
                self._push(self.now + self._transfer.time(nbytes), _MIGRATE_DONE, rid, t)
            else:  # booked: when it lapses unrenewed, the peer's admission resumes
                self._push(t.decode.bookings[rid][1], _BOOKING_DUE, None, t)
        self._flush(w)

    # -- FluidRole ------------------------------------------------------------------------------
    def begin_switch(self, wid: str, target: Role, mode: DrainMode) -> None:
        w = self.workers[wid]
        self._interrupt(w)
        w.begin_switch(target, self.now, mode)
        self._drain_started[wid] = self.now
        if drain_releases_reserved(w.role):
            # Reserved requests whose prefill has not started get a new pair, so the drain
            # waits only for work that is really in flight (the peer's answer: its cancel).
            for rid, p in release_asks(w.decode.reserved, self._prefill_worker_of):
                if p.prefill.cancel(rid) is not None:
                    w.decode.cancel(rid)
                    req = self.requests[rid]
                    req.reassigned += 1
                    self._dispatch(req)
        self._flush(w)
        self._after_change(w)

    def _prefill_worker_of(self, rid: int) -> Worker | None:
        return self.workers.get(self.requests[rid].prefill_worker)

    def _switch_done(self, wid: str) -> None:
        w = self.workers[wid]
        source = w.role
        target = w.complete_switch(self.now)
        drain_s = self.now - self._drain_started.pop(wid, self.now)
        self.switches.append(RoleSwitch(self.now, wid, source.value, target.value, drain_s))
        self.role_policy.switch_finished(wid, self.now)
        self._kick(w)

    def _control(self) -> None:
        self._expire()
        for w in self.workers.values():
            self._sync(w)
        n_prefill = max(1, len(self.pool(Role.PREFILL)))
        signals = [w.pressure(self.now, n_prefill).signals() for w in self.workers.values()]
        decision = self.role_control.observe(self.now, signals)
        if isinstance(decision, SwitchDecision) and self.cfg.mechanisms.fluidrole:
            self.begin_switch(decision.worker, decision.target, decision.drain_mode)
        if self.cfg.mechanisms.autoscale:
            self._autoscale()
        self._sample()

    def _expire(self) -> None:
        limit = self.now - self.cfg.timeout_s
        q = self._waiting_first
        while q and q[0].arrival < limit:
            req = q.popleft()
            if math.isnan(req.first_token_t) and not req.failed:
                self._fail(req)

    def _autoscale(self) -> None:
        """Dynamo-like baseline: add a worker to a phase that stays pressured."""
        cfg, acfg = self.cfg.role_cfg, self.cfg.autoscale_cfg
        p = self.role_policy.last_pressure
        pressured = {
            Role.PREFILL: p.ppi_bar > cfg.ppi_high,
            Role.DECODE: p.dpi_load_bar >= cfg.dpi_load_high or p.dpi_adm_bar > acfg.dpi_adm_scale,
        }
        for role, hot in pressured.items():
            if not hot:
                self._pressured_since.pop(role, None)
                continue
            since = self._pressured_since.setdefault(role, self.now)
            room = len(self.workers) < acfg.max_workers
            if room and not self._scale_pending and self.now - since >= acfg.detection_s:
                self._scale_pending = True
                self.scale_outs.append({"t": round(self.now, 3), "role": role.value})
                self._push(self.now + acfg.provisioning_s, _SCALE_READY, role)
                self._pressured_since.pop(role, None)

    def _sample(self) -> None:
        s = self.series
        s.t.append(round(self.now, 3))
        roles = [w.role for w in self.workers.values()]
        s.n_prefill.append(roles.count(Role.PREFILL))
        s.n_decode.append(roles.count(Role.DECODE))
        s.prefill_queue.append(
            sum(w.prefill.queue_len for w in self.workers.values() if w.role is Role.PREFILL)
        )
        stolen = sum(w.prefill.stolen_tokens for w in self.workers.values())
        s.stolen_tokens.append(stolen - self._stolen_seen)
        self._stolen_seen = stolen
        pp = self.role_policy.last_pressure
        s.ppi_bar.append(round(pp.ppi_bar, 4))
        s.dpi_load_bar.append(round(pp.dpi_load_bar, 4))
        s.dpi_adm_bar.append(round(pp.dpi_adm_bar, 4))

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> SimResult:
        for req in self.requests:
            self._push(req.arrival, _ARRIVE, req)
        self._push(0.0, _CONTROL)
        total = len(self.requests)
        events = self._events
        interval = self.cfg.role_cfg.interval_s
        while events:
            t, _, kind, a, b = heapq.heappop(events)
            self.now = t
            self._events_handled += 1
            if kind == _BATCH_DONE:
                wid = a
                assert isinstance(wid, str)
                if self._ticket.get(wid) != b:
                    continue  # a span that was cut short: its completion moved earlier
                w = self.workers[wid]
                batch = self.busy.pop(wid)
                measured = t - batch.start
                kind_name = "prefill" if isinstance(batch, PrefillBatch) else "decode"
                iterations = batch.iterations if isinstance(batch, DecodeBatch) else 1
                self._record_error(kind_name, batch.predicted_s, measured, iterations)
                steps = self._span_steps.pop(wid, None)
                self._span_ends.pop(wid, None)
                w.finish_batch(batch, t, measured, steps)
                self._flush(w)
                self._after_change(w)
                if w.state is not RoleState.SWITCH:
                    self._kick(w)
            elif kind == _ARRIVE:
                assert isinstance(a, Request)
                self._waiting_first.append(a)
                self.role_control.arrived(t, a.prompt_len, a.max_new_tokens)
                self._dispatch(a)
            elif kind == _HANDOFF_DONE:
                assert isinstance(a, Handoff)
                p, d = self.workers[a.prefill_worker], self.workers[a.decode_worker]
                p.prefill.transfer_done(a.rid)
                self._interrupt(d)
                d.decode.handoff_done(a.rid, a.prefix_tokens, t)
                self._flush(d)
                self._after_change(p)
                self._kick(d)
            elif kind == _CONTROL:
                self._control()
                if self._done < total:
                    self._push(t + interval, _CONTROL)
            elif kind == _MIGRATE_DONE:
                assert isinstance(a, int) and isinstance(b, Worker)
                self._interrupt(b)
                b.decode.activate(a)
                self._kick(b)
            elif kind == _BOOKING_DUE:
                assert isinstance(b, Worker)
                if b.decode.expire_bookings(t):
                    self._flush(b)
                    self._kick(b)
            elif kind == _SWITCH_DONE:
                assert isinstance(a, str)
                self._switch_done(a)
            elif kind == _SCALE_READY:
                assert isinstance(a, Role)
                self._scale_pending = False
                self._kick(self._add_worker(a))
            if self._done == total and kind != _CONTROL:
                break
        if self._done != total:
            stuck = total - self._done
            raise SimulationError(f"{stuck} requests never finished (simulation stalled)")
        return SimResult(
            self.requests,
            self.switches,
            self.series,
            sum(w.prefill.stolen_tokens for w in self.workers.values()),
            self.scale_outs,
            self.now,
            self._events_handled,
            {k: round(total / n, 4) for k, (total, n) in self._pred_err.items() if n},
        )


def simulate(workload: Workload, cfg: SimConfig) -> SimResult:
    return Simulator(workload, cfg).run()
