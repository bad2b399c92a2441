"""FluidToken inside SGLang's decode scheduler: run a stolen suffix as a real extend forward.

Runs in SGLang's scheduler process (standard library, SGLang and FluidPD's pure core). The
prefill server computed only the prefix ``input_ids[:p]`` of a request (FluidPD's prefill
sidecar sent it just that) and shipped that KV into the first ``p`` slots of the decode
server's pre-allocation (SGLang's transfer slices destinations positionally, so a shorter
source is fine). The decode sidecar registers ``p`` here (``register``, over the hook's HTTP
port: the number of stolen suffix tokens, as FluidPD's suffix commit carries it) before the
prefill server starts, so it is known when the transfer lands. Then:

* ``DecodeTransferQueue._commit_transfer_to_req``: for such a request the prefill server's
  sampled token is meaningless (it came from the prefix's last position) and is not
  appended; the request is marked and goes to the waiting queue as usual (where SGLang's
  abort and idle checks see it).
* ``get_next_disagg_decode_batch_to_run``: a marked request is taken out of the waiting queue
  (SGLang's prebuilt path would decode it as if its whole prompt had been computed) and run
  as a real EXTEND batch of its suffix on top of the transferred prefix KV, through SGLang's
  own ``prepare_for_extend`` / ``run_batch`` / ``process_batch_result`` (which samples and
  streams the first token); the next iteration merges it into the running decode batch, as
  SGLang's normal scheduler does after a prefill.
* beta = 1 (``p = 0``): the prefill server is never asked; the request's receiver is told its
  (empty) transfer has landed, as SGLang's fake bootstrap host does, and the whole prompt runs
  here.

The suffix's KV slots were pre-allocated with the prompt; they are handed back to the
allocator and taken again by ``prepare_for_extend`` (the stock path continues a request that
already holds a request-pool row, like a chunked prefill), so KV accounting is SGLang's own.
That needs ``page_size`` 1 (a partial page would free prefix slots); ``register`` refuses
otherwise. One extend runs per iteration and a decode iteration of the running batch runs
between two of them: the stealing budget the decode sidecar advertises (eqs. 12-17, FluidPD's
core) bounds how much suffix work prefill workers send here in the first place. And an extend
runs only within every running stream's TPOT room (the core's ``stream_tpot_room``, as the
simulator's and the sim-engine's decode scheduler, ``DecodeSide.next_batch``): the decode
sidecar registers each split with the profile's prediction of its extend's seconds and the
TPOT target; the room reads each running request's first-token time and tokens from SGLang
and the decode iteration's period as measured here, and counts the steps the stolen request's
own stream will slow once it joins (``Streams.joining_s``, measured here too). Until the suffix
fits, the running batch decodes on without it (``_stats["held"]`` counts those iterations).

On the prefill side, ``Scheduler.process_batch_result_disagg_prefill`` (where SGLang, the
forward of a request's last chunk done, starts sending its KV) records the request as
*forwarded*; ``POST /forwarded {"rid", "timeout"}`` answers as soon as that has happened (a
long poll). The prefill sidecar's planner releases its next request to SGLang then, while this
one's KV is still in transfer (``fluidtoken.PrefillPlanner``'s window).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

# The pure core (numpy only) runs here too: ``server.core_path`` puts it on SGLang's path.
from fluidpd.core.fluidtoken import IterationError, stream_tpot_room


@dataclass(frozen=True, slots=True)
class _Split:
    tokens: int  #: stolen suffix tokens
    suffix_s: float  #: the decode sidecar's prediction of their extend's seconds
    tpot: float  #: the TPOT target running streams are held to (0: none)
    at: float  #: registration time (``time.monotonic``)
    #: The decode sidecar's prediction of the seconds the request's stream adds to each
    #: decode step once it joins (eq. 13): the hook's measurement replaces it once it has one.
    step_s: float = 0.0


#: Registered splits: SGLang rid -> its split.
_splits: dict[str, _Split] = {}
#: Splits whose prefill server never gets the room (p = 0): rooms to forget on the prefill
#: side (its transfer engine keeps the decode side's destination list for every room).
_forget: dict[int, float] = {}
_lock = threading.Lock()
#: A registration nobody used (the request never came, or was aborted first) expires.
SPLIT_TTL_S = 900.0
_stats: dict[str, Any] = {
    "extends": 0,
    "extend_tokens": 0,
    "forwarded": 0,
    "held": 0,
    "extend_seconds": 0.0,
    "extend_predicted_seconds": 0.0,
}
#: Prefill side: rids whose forward is done (KV being sent), rid -> when; taken by a waiter.
_forwarded: dict[str, float] = {}
_forwarded_cv = threading.Condition()
#: A forwarded rid nobody asked about (no FluidToken planner, or its answer came first).
FORWARDED_TTL_S = 120.0
_scheduler: dict[str, Any] = {"s": None}
#: Set on a batch this module built (its ``_Split``), so the next iteration merges it and
#: times it.
_MARK = "_fluidpd_extend"
#: Set on a request whose prefix KV landed and whose suffix still has to run: its ``_Split``
#: (the prefix length and the extend's TPOT room both come from it).
_PENDING = "_fluidpd_pending"
#: Set on a request once its suffix ran here: its stream is a stolen one.
_STOLEN = "_fluidpd_stolen"
#: Busy iterations (extends aside) whose periods make the room's iteration time.
PERIODS_KEPT = 32
#: Decode steps whose fastest is the pace a stream is given up at: many more than a stolen
#: suffix's stream stays in the batch (its long context slows every step while it does).
FASTEST_KEPT = 1024
#: Decode steps kept of each kind, with a stolen request's stream in the batch and without,
#: whose means' difference is what a joining stolen stream adds to a step.
JOINED_KEPT = 256
#: Steps of each kind before that difference replaces the sidecar's prediction.
JOINED_MIN = 8


class SplitRefused(ValueError):
    """The split cannot be run here (bad values or an unsupported server config)."""


def register(
    rid: str, suffix: int, suffix_s: float = 0.0, tpot: float = 0.0, step_s: float = 0.0
) -> None:
    s = _scheduler["s"]
    if s is not None:
        page = int(getattr(s.token_to_kv_pool_allocator, "page_size", 1))
        if page != 1:
            raise SplitRefused(f"page_size {page}: suffix extends need page_size 1")
    if suffix < 1:
        raise SplitRefused("suffix must be >= 1")
    if not (suffix_s >= 0.0 and tpot >= 0.0 and step_s >= 0.0):  # also refuses NaN
        raise SplitRefused("suffix_s, tpot and step_s must be >= 0")
    with _lock:
        _splits[str(rid)] = _Split(
            int(suffix), float(suffix_s), float(tpot), time.monotonic(), float(step_s)
        )


class Streams:
    """What the TPOT room needs of SGLang's running decode streams: each one's first-token
    time and tokens out (SGLang's own request state), and the decode iterations' periods,
    measured here between two calls of the batch selection (SGLang's loop without the
    overlap scheduler, which FluidToken's extend needs: receive, run, process; what a stream
    waits between two of its tokens)."""

    def __init__(self) -> None:
        #: (seconds, whether a decode step ran) of the last busy iterations that were not
        #: extends: decode steps and SGLang's own steps for arriving requests.
        self.periods: deque[tuple[float, bool]] = deque(maxlen=PERIODS_KEPT)
        self.steps: deque[float] = deque(maxlen=FASTEST_KEPT)
        #: Decode steps with a stolen request's stream in the batch, and without one.
        self.joined: deque[float] = deque(maxlen=JOINED_KEPT)
        self.plain: deque[float] = deque(maxlen=JOINED_KEPT)
        self.last_call: float | None = None
        #: The extends' measured seconds against the decode sidecar's prediction: a profile
        #: of another GPU, or an engine slower than it, mispredicts every extend alike.
        self.extend_error = IterationError()

    def observe(
        self,
        now: float,
        decoded: bool,
        extended: _Split | None = None,
        idle: bool = False,
        stolen: bool = False,
    ) -> None:
        """The batch selection is called at ``now`` (``time.perf_counter``); ``decoded``: the
        iteration since the last call was a decode step of the running batch (``stolen``:
        with a stolen request's stream in it); ``extended``: it was the extend of that
        split; ``idle``: no batch ran."""
        if self.last_call is not None and not idle:
            if extended is None:
                self.periods.append((now - self.last_call, decoded))
                if decoded:
                    self.steps.append(now - self.last_call)
                    (self.joined if stolen else self.plain).append(now - self.last_call)
            else:
                took = now - self.last_call
                self.extend_error.add(extended.suffix_s, took)
                _stats["extend_seconds"] += took
                _stats["extend_predicted_seconds"] += extended.suffix_s
        self.last_call = now

    def iteration_s(self) -> float:
        """What a running stream waits per token, extends aside: the busy iterations' seconds
        over the decode steps among them. The mean, not the median: a stream's TPOT is a
        mean, so the room must budget the slow iterations (a transfer landing, SGLang's step
        for arriving requests) the median leaves out; with the median, streams held at the
        edge of their room drifted past it."""
        steps = sum(1 for _, decoded in self.periods if decoded)
        return sum(sec for sec, _ in self.periods) / steps if steps else 0.0

    def fastest_s(self) -> float:
        """The fastest of the last ``FASTEST_KEPT`` decode steps: a stream that misses TPOT
        even at that pace is given up (``stream_tpot_room``'s ``fastest_s``). Not the fastest
        of the iteration's own window: while stolen suffixes' long contexts decode, every
        step is slower, and the streams they slow, read at that pace, were given up and
        the next suffixes ran (12,000-token suffixes on an H100 at a 12.2 ms target: every
        request missed TPOT with the room as without it)."""
        return min(self.steps, default=0.0)

    def joining_s(self, predicted: float) -> float:
        """What a stolen request's stream adds to each decode step: the mean step with one in
        the batch less the mean step without, once both were seen ``JOINED_MIN`` times; until
        then the decode sidecar's ``predicted`` (eq. 13). Measured, not taken from eq. 13's
        sum over contexts: a decode step's attention waits for its longest context, so one
        12,000-token stream beside twelve short ones took an H100's step from about 8.2 to
        12.5 ms, where eq. 13 (the H100 profile) adds 0.6 ms, and more such streams at once
        add little more (results/sglang/h100-room-2026-12-06, run6). One figure for the
        server, whatever the stolen prompt's length: where those vary widely, it reads their
        mix of the last ``JOINED_KEPT`` steps."""
        if len(self.joined) < JOINED_MIN or len(self.plain) < JOINED_MIN:
            return predicted
        joined = sum(self.joined) / len(self.joined)
        return max(0.0, joined - sum(self.plain) / len(self.plain))

    def room(
        self, now: float, tpot: float, running: list[Any], joining: tuple[float, int] = (0.0, 0)
    ) -> float:
        """``stream_tpot_room`` of the ``running`` requests at ``now``: the most seconds an
        extend may take before their next decode step, with the stream it adds slowing each
        step by ``joining[0]`` seconds for ``joining[1]`` steps."""
        streams = []
        for r in running:
            first = _first_token_time(r)
            if first <= 0.0 or r.finished():
                continue  # not streaming yet, or leaving the batch: no TPOT to keep
            streams.append((now - first, len(r.output_ids), _max_new(r)))
        return stream_tpot_room(
            tpot, self.iteration_s(), streams, fastest_s=self.fastest_s(), joining=(joining,)
        )

    def fits(self, split: _Split, now: float, running: list[Any], steps: int = 0) -> bool:
        """Whether ``split``'s extend may run at ``now``, before the ``running`` requests'
        next decode step: its predicted seconds, stretched by how much longer than predicted
        this server's extends ran (``IterationError``, never below 1), within the room, with
        its stream (``steps``: its ``max_new_tokens``) slowing each step it shares with them
        (``joining_s``). Steps a stolen stream already in the batch shares with it are not
        counted again: the mean iteration holds them."""
        if split.tpot <= 0.0 or not running:
            return True  # nothing to keep, or a caller that did not say: the budget bounds it
        expected = split.suffix_s * self.extend_error.stretch
        left = max((_left(r) for r in running if hasattr(r, _STOLEN)), default=0)
        joining = (self.joining_s(split.step_s), max(0, steps - left))
        return expected <= self.room(now, split.tpot, running, joining)


def _left(req: Any) -> int:
    """Tokens ``req`` may still decode (SGLang's ``max_new_tokens`` less its output)."""
    return max(0, _max_new(req) - len(req.output_ids))


def _max_new(req: Any) -> int:
    return int(getattr(req.sampling_params, "max_new_tokens", 0) or 0)


def _first_token_time(req: Any) -> float:
    """When SGLang stamped ``req``'s first token here (``perf_counter``; 0 when not yet): the
    prebuilt step of a request the prefill server computed, or the extend of a stolen one."""
    ts = getattr(req, "time_stats", None)
    if ts is None:
        return 0.0
    return float(getattr(ts, "decode_prebuilt_finish_time", 0.0) or 0.0) or float(
        getattr(ts, "prefill_finished_time", 0.0) or 0.0
    )


_streams = Streams()


def forget_room(room: int) -> None:
    """Prefill side, p = 0: drop the decode side's destination list for a room that never
    comes here (swept by ``_sweep`` when it has arrived)."""
    with _lock:
        _forget[int(room)] = time.monotonic()


def mark_forwarded(rids: list[str]) -> None:
    """Prefill side: these requests' forwards are done (their KV transfer has started)."""
    now = time.monotonic()
    with _forwarded_cv:
        for rid in rids:
            _forwarded[rid] = now
        _stats["forwarded"] += len(rids)
        for rid in [r for r, t in _forwarded.items() if now - t > FORWARDED_TTL_S]:
            del _forwarded[rid]
        _forwarded_cv.notify_all()


def wait_forwarded(rid: str, timeout_s: float) -> bool:
    """Whether ``rid``'s forward is done, waiting up to ``timeout_s`` for it (consumes it)."""
    deadline = time.monotonic() + max(0.0, min(timeout_s, 30.0))
    with _forwarded_cv:
        while rid not in _forwarded:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _forwarded_cv.wait(left)
        del _forwarded[rid]
        return True


def _patch_prefill_result(cls: Any) -> None:
    original = cls.process_batch_result_disagg_prefill

    def process(self: Any, batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        # Requests whose last chunk this batch computed (SGLang's own test: no middle chunks
        # in flight); the others are still being chunked.
        last = [str(r.rid) for r in batch.reqs if r.inflight_middle_chunks <= 0]
        try:
            return original(self, batch, result, *args, **kwargs)
        finally:
            if last:
                mark_forwarded(last)

    cls.process_batch_result_disagg_prefill = process


def _sweep() -> None:
    now = time.monotonic()
    with _lock:
        for rid in [r for r, split in _splits.items() if now - split.at > SPLIT_TTL_S]:
            del _splits[rid]
        rooms = list(_forget.items())
    s = _scheduler["s"]
    q = getattr(s, "disagg_prefill_bootstrap_queue", None) if s is not None else None
    mgr = getattr(q, "kv_manager", None)
    tables = [getattr(mgr, name, None) for name in ("transfer_infos", "request_status")]
    for room, t in rooms:
        for table in tables:
            if table is not None:
                table.pop(room, None)  # a dict pop is atomic under the GIL
        if now - t > SPLIT_TTL_S:
            with _lock:
                _forget.pop(room, None)


def _sweeper() -> None:
    while True:
        time.sleep(1.0)
        with contextlib.suppress(Exception):  # never let bookkeeping kill the thread
            _sweep()


def snapshot_fields() -> dict[str, Any]:
    """What ``hook.snapshot`` adds: the rids whose split is registered and whose suffix has
    not run yet (the decode sidecar subtracts their tokens from its stealing budget),
    counters, and the measured seconds a stolen stream adds to a decode step."""
    s = _scheduler["s"]
    with _lock:
        pending = set(_splits)
    if s is not None:
        pending.update(str(r.rid) for r in list(s.waiting_queue) if hasattr(r, _PENDING))
    blocked = 0
    q = getattr(s, "disagg_decode_prealloc_queue", None) if s is not None else None
    if q is not None:
        # Handshake done, waiting for KV room: decode admission is the bottleneck.
        blocked = sum(1 for dr in list(q.queue) if getattr(dr, "waiting_for_input", False))
    return {
        "fluid_pending": sorted(pending),
        "fluid": dict(_stats),
        "prealloc_blocked": blocked,
        # What a stolen stream adds to a decode step, as measured here (0: not yet).
        "fluid_joining_s": _streams.joining_s(0.0),
    }


class _Landed:
    """A receiver whose (empty, p = 0) transfer has landed; clears the real one."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def poll(self) -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: PLC0415

        return KVPoll.Success

    def clear(self) -> None:
        if self.real is not None:
            self.real.clear()

    def abort(self) -> None:
        if self.real is not None:
            self.real.abort()

    def failure_exception(self) -> None:
        raise RuntimeError("a FluidToken p = 0 transfer cannot fail")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _prefix_len(req: Any, split: _Split) -> int:
    """Prompt tokens the prefill server computed: all but the stolen suffix."""
    return max(0, len(req.origin_input_ids) - split.tokens)


def _split_of(req: Any) -> int | None:
    with _lock:
        hit = _splits.get(str(req.rid))
    return None if hit is None else _prefix_len(req, hit)


def _patch_transfer_queue(cls: Any) -> None:
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST  # noqa: PLC0415

    pop_original = cls.pop_transferred
    commit_original = cls._commit_transfer_to_req

    def pop_transferred(self: Any, *args: Any, **kwargs: Any) -> Any:
        for dr in self.queue:
            if isinstance(dr.kv_receiver, _Landed) or _split_of(dr.req) != 0:
                continue
            # Nothing comes from a prefill server: what the fake bootstrap host means to
            # SGLang (its metadata gate and room check skip the request).
            dr.kv_receiver = _Landed(dr.kv_receiver)
            dr.req.bootstrap_host = FAKE_BOOTSTRAP_HOST
        return pop_original(self, *args, **kwargs)

    def commit(self: Any, decode_req: Any) -> Any:
        req = decode_req.req
        with _lock:
            split = _splits.pop(str(req.rid), None)
        if split is None:
            return commit_original(self, decode_req)
        # The prefill server's token came from position p - 1 of the prompt, not its end.
        setattr(req, _PENDING, split)
        decode_req.kv_receiver.clear()
        decode_req.kv_receiver = None
        req.time_stats.set_wait_queue_entry_time()
        return None

    cls.pop_transferred = pop_transferred
    cls._commit_transfer_to_req = commit


def _extend_batch(s: Any, req: Any) -> Any:
    """A real EXTEND batch of ``req``'s suffix over its transferred prefix KV."""
    import torch  # noqa: PLC0415
    from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: PLC0415
    from sglang.srt.managers.scheduler_components.metrics_reporter import (  # noqa: PLC0415
        PrefillStats,
    )
    from sglang.srt.observability.metrics_collector import QueueCount  # noqa: PLC0415

    split = getattr(req, _PENDING)
    p = _prefix_len(req, split)
    delattr(req, _PENDING)
    n = len(req.origin_input_ids)
    row = s.req_to_token_pool.req_to_token[req.req_pool_idx]
    # The suffix's pre-allocated slots go back; prepare_for_extend takes n - p again.
    s.token_to_kv_pool_allocator.free(row[p:n].to(torch.int64).clone())
    req.prefix_indices = row[:p].to(torch.int64).clone()
    req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
    req.set_extend_range(p, n)
    batch = ScheduleBatch.init_new(
        [req],
        s.req_to_token_pool,
        s.token_to_kv_pool_allocator,
        s.tree_cache,
        s.model_config,
        s.enable_overlap,
        s.spec_algorithm,
    )
    batch.prepare_for_extend()
    batch.prefill_stats = PrefillStats(
        log_input_tokens=n - p,
        log_hit_tokens=p,
        new_token_ratio=float(s.new_token_ratio_tracker.current),
        num_running_reqs=QueueCount.from_reqs(s.running_batch.reqs),
        num_new_seqs=1,
    )
    setattr(batch, _MARK, split)
    setattr(req, _STOLEN, True)
    _stats["extends"] += 1
    _stats["extend_tokens"] += n - p
    return batch


def _patch_next_batch(cls: Any) -> None:
    from sglang.srt.managers.scheduler import NextBatchPlan  # noqa: PLC0415

    original = cls.get_next_disagg_decode_batch_to_run

    def next_batch(self: Any, running_batch: Any) -> Any:
        last = self.last_batch
        extended = None if last is None else getattr(last, _MARK, None)
        ran_extend = extended is not None
        now = time.perf_counter()
        decoded = last is not None and not ran_extend and last.forward_mode.is_decode()
        # Only once a suffix ran here: a scan of the batch per step is the hook's cost.
        stolen = decoded and _stats["extends"] > 0 and any(hasattr(r, _STOLEN) for r in last.reqs)
        _streams.observe(now, decoded, extended, idle=last is None, stolen=stolen)
        if ran_extend:
            # As SGLang's normal scheduler does after a prefill: the extended request joins
            # the running decode batch (finished ones are filtered out first).
            setattr(last, _MARK, None)
            last.filter_batch()
            if not last.is_empty():
                if running_batch.is_empty():
                    running_batch = last
                else:
                    running_batch.merge_batch(last)
        fluid = [r for r in self.waiting_queue if hasattr(r, _PENDING)]
        if not fluid:
            return original(self, running_batch)
        running = [] if running_batch.is_empty() else list(running_batch.reqs)
        req = extend_next(fluid, ran_extend, running, now)
        if req is not None:
            self.waiting_queue = [r for r in self.waiting_queue if r is not req]
            self.running_batch = running_batch
            batch = _extend_batch(self, req)
            return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)
        return _without(self, running_batch, fluid, original)

    cls.get_next_disagg_decode_batch_to_run = next_batch


def extend_next(fluid: list[Any], ran_extend: bool, running: list[Any], now: float) -> Any:
    """The request whose suffix extend runs now, or None for a decode step first: one extend
    per iteration, a decode step of a non-empty batch between two, and none that would push
    a running stream past its TPOT (the first waiting suffix waits for room: FIFO, as the
    core's ``DecodeSide.next_batch``)."""
    if ran_extend and running:
        return None
    req = fluid[0]
    if not _streams.fits(getattr(req, _PENDING), now, running, _max_new(req)):
        _stats["held"] += 1
        return None
    return req


def _without(s: Any, running_batch: Any, fluid: list[Any], original: Any) -> Any:
    """SGLang's own batch selection, which must not take the requests whose suffix has not
    run (its prebuilt path would decode them as if their whole prompt had been computed)."""
    s.waiting_queue = [r for r in s.waiting_queue if not hasattr(r, _PENDING)]
    try:
        return original(s, running_batch)
    finally:
        s.waiting_queue = fluid + list(s.waiting_queue)


def install(scheduler_cls: Any) -> None:
    """Patch SGLang's decode transfer queue and decode batch selection (scheduler process)."""
    from sglang.srt.disaggregation.decode import DecodeTransferQueue  # noqa: PLC0415

    _patch_transfer_queue(DecodeTransferQueue)
    _patch_next_batch(scheduler_cls)
    _patch_prefill_result(scheduler_cls)
    threading.Thread(target=_sweeper, name="fluidpd-fluidtoken", daemon=True).start()


def bind(scheduler: Any) -> None:
    _scheduler["s"] = scheduler


def handle_post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``POST /split {"rid", "suffix"}`` (decode), ``POST /forget {"room"}`` and ``POST
    /forwarded {"rid", "timeout"}`` (prefill; a long poll, at most 30 s)."""
    try:
        if path == "/forwarded":
            done = wait_forwarded(str(body["rid"]), float(body.get("timeout", 5.0)))
            return 200, {"forwarded": done}
        if path == "/split":
            register(
                str(body["rid"]),
                int(body["suffix"]),
                float(body.get("suffix_s", 0.0)),
                float(body.get("tpot", 0.0)),
                float(body.get("step_s", 0.0)),
            )
            return 200, {"ok": True}
        if path == "/forget":
            forget_room(int(body["room"]))
            return 200, {"ok": True}
    except (KeyError, TypeError, ValueError) as exc:
        return 400, {"error": str(exc)}
    return 404, {"error": f"no route {path}"}
