"""FluidToken for the ``sglang`` engine, on the sidecar side (FluidPD's interpreter).

Prefill (``PrefillPlanner``): the core's ``PrefillSide`` (``fluidpd.core.scheduler.prefill``:
FIFO, one request at a time, Algorithm 1 over the waiting queue with the paired decode
workers' budgets, or ``--force-steal``) decides each request's split at its scheduling
iteration, exactly as for the other engines; the sidecar then sends SGLang's prefill server
only ``input_ids[:p]`` (nothing when p = 0, and the prefill hook forgets the room).

The planner pipelines: a request is the core's running batch until SGLang's forward of it is
done (the hook's ``POST /forwarded`` long poll answers then, ``fluidtoken_hook``), which is the
core's ``finish_batch``; its KV transfer (the core's pending hand-off) then goes on while the
next request is planned and released. At most ``window`` requests are in SGLang at once (one
computing, the others' KV in transfer): SGLang's Mooncake transfers overlap each other and the
next forward, and the requests not yet released stay in the core's queue, where Algorithm 1
still decides their splits. ``window`` 1 is the unpipelined planner: one request's whole
SGLang call (compute and transfer) before the next.

With ``batching`` (``--sglang-prefill-batching``), a request the planner left whole (nothing
stolen) is handed to SGLang and the next one planned at once (``PrefillSide.hand_over``: its
predicted compute stays in the core's backlog), so that SGLang batches a burst's forwards as
its own P/D does; a request with a stolen suffix still waits for the forward before it. Off
by default: on an H100 it did not close the 4-5 pp by which this path trailed SGLang's own P/D
in a burst (``results/sglang/h100-live-2026-12-07-batching``; nothing was stolen there, and
the router's round-robin pairing against SGLang's random one is a confound). Before the
prefix goes to SGLang, the stolen count goes to the decode sidecar (``POST
/v1/internal/suffix``, the same message the other engines send), which registers it with its
SGLang's FluidToken hook (``fluidtoken_hook``): the split is known there before the prefix KV
can land. If that fails, the whole prompt is prefilled instead (always safe: the decode side
would at worst recompute a suffix whose KV it already has).

SGLang's own bootstrap queue keeps gating the prefill server on the decode side's KV
pre-allocation, so a request enters the planner's waiting queue on arrival.

Decode (``DecodeSplits``): registers splits with the hook, and the stealing budget it
advertises (``/pressure``'s ``steal_budget``, ``/v1/internal/budget``, the answer to a suffix
commit) is the core's eqs. 12-17 (``fluidpd.core.fluidtoken.advertised_budget``) over SGLang's
own decode state from the hook's snapshot: batch size, context, DPI_load, and the suffix tokens
registered here that have not run yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from fluidpd.api.commands import SGLANG_PREFILL_WINDOW
from fluidpd.api.internal import PrefillHalf, PrefillOutcome, PressureReport, SuffixCommit
from fluidpd.core.fluidtoken import FluidTokenConfig, KvIntake, advertised_budget
from fluidpd.core.profile import Profile
from fluidpd.core.scheduler.messages import SuffixCommitted
from fluidpd.core.scheduler.prefill import PrefillBatch, PrefillSide
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.types import SLO, Request, Role
from fluidpd_sidecar.peers import PeerError, Peers, refresh_budgets

log = logging.getLogger("fluidpd.sidecar.sglang")

#: Sends ``ids`` (a prefix of the half's prompt) to SGLang's prefill server and waits for it.
PrefillCall = Callable[[PrefillHalf, list[int]], Coroutine[Any, Any, PrefillOutcome]]
#: Requests in SGLang's prefill server at once by default (computing or sending KV).
DEFAULT_WINDOW = SGLANG_PREFILL_WINDOW
#: One long poll of the hook's ``/forwarded`` waits at most this long (then it is asked again).
FORWARDED_POLL_S = 2.0


@dataclass(slots=True)
class _Queued:
    half: PrefillHalf
    outcome: asyncio.Future[PrefillOutcome]


class PrefillPlanner:
    """The prefill sidecar's FluidToken scheduling loop over the core's ``PrefillSide``."""

    def __init__(
        self,
        worker_id: str,
        profile: Profile,
        slo: SLO,
        token_cfg: FluidTokenConfig,
        force_steal: float | None,
        peers: Peers,
        call: PrefillCall,
        abort: Callable[[int], Awaitable[None]],
        hook_url: str,
        budget_refresh_s: float = 0.1,
        window: int = DEFAULT_WINDOW,
        batching: bool = False,
    ) -> None:
        if window < 1:
            raise ValueError(f"the prefill window must be >= 1, got {window}")
        self.side: PrefillSide = Worker.create(
            worker_id, Role.PREFILL, profile, slo, token_cfg, False, time.time()
        ).prefill
        self.side.forced_steal = force_steal
        self.token_cfg = token_cfg
        self.peers = peers
        self.call = call
        self.abort = abort
        self.hook_url = hook_url
        self.budget_refresh_s = budget_refresh_s
        self.queued: dict[int, _Queued] = {}
        #: Per-prefill stealing budgets the paired decode workers advertise, by worker id.
        self.budgets: dict[str, float] = {}
        self._decode_urls: dict[str, str] = {}
        self.window = window
        self.batching = batching
        #: Started requests not yet answered by SGLang (computing, or their KV in transfer).
        self.executing: dict[int, asyncio.Task[None]] = {}
        #: Most requests seen in SGLang at once, and releases made while another was there.
        self.max_in_flight = 0
        self.overlapped = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5))
        self._tasks = [
            asyncio.create_task(self._run(), name="fluidtoken-prefill"),
            asyncio.create_task(self._refresh_budgets(), name="fluidtoken-budgets"),
        ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self.executing.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._client is not None:
            await self._client.close()

    @property
    def in_flight(self) -> int:
        """Requests in SGLang's prefill server now (released and not answered)."""
        return len(self.executing)

    @property
    def stolen_tokens(self) -> int:
        return self.side.stolen_tokens

    def queue_entries(self) -> list[dict[str, Any]]:
        """Requests held here, not yet given to SGLang, as the snapshot's queue entries (so
        that /pressure counts them)."""
        return [
            {"rid": str(r.rid), "prompt_len": r.prompt_len, "arrival": r.arrival}
            for r in [*self.side.bootstrap.values(), *self.side.waiting]
        ]

    async def prefill(self, half: PrefillHalf) -> PrefillOutcome:
        req = Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens)
        req.decode_worker = half.decode_worker
        future: asyncio.Future[PrefillOutcome] = asyncio.get_running_loop().create_future()
        self.queued[half.rid] = _Queued(half, future)
        self._decode_urls[half.decode_worker] = half.decode_url
        self.side.add(req)
        # SGLang's bootstrap queue gates its prefill server on the decode side's KV
        # pre-allocation; here the request is schedulable at once.
        self.side.reserved(half.rid, time.time())
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            if half.rid in self.executing:
                await self.abort(half.rid)  # the router went away mid-prefill
            raise
        finally:
            self.queued.pop(half.rid, None)
            self.side.cancel(half.rid)  # a no-op once started

    def _budget_source(self, decode_ids: Sequence[str]) -> np.ndarray:
        return np.array([self.budgets.get(d, 0.0) for d in decode_ids], dtype=np.float64)

    async def _run(self) -> None:
        while True:
            try:
                self._wake.clear()
                batch = None
                # The core runs one batch at a time: the next is planned once the running one's
                # forward is done (``finish_batch``), and only while the window has room.
                if self.side.running is None and len(self.executing) < self.window:
                    budgets = self._budget_source if self.token_cfg.enabled else None
                    batch = self.side.next_batch(time.time(), budgets)
                if batch is None:
                    await self._wake.wait()
                    continue
                self._release(batch)
                if self.batching and batch.request.stolen == 0:
                    self._forward_done(batch, handed=True)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the queue; log and go on
                log.exception("FluidToken prefill iteration failed")
                await asyncio.sleep(0.01)

    def _release(self, batch: PrefillBatch) -> None:
        rid = batch.request.rid
        if self.executing:
            self.overlapped += 1
        # The batch's suffix commit, taken now: the next batch may be planned (and its own
        # commit queued) before this task first runs.
        commits = [m for m in self.side.outbox if isinstance(m, SuffixCommitted)]
        self.side.outbox.clear()
        task = asyncio.create_task(self._execute(batch, commits), name=f"fluidtoken-prefill-{rid}")
        self.executing[rid] = task
        self.max_in_flight = max(self.max_in_flight, len(self.executing))
        task.add_done_callback(lambda _t: self._done(rid))

    def _done(self, rid: int) -> None:
        self.executing.pop(rid, None)
        self._wake.set()

    def _forward_done(self, batch: PrefillBatch, handed: bool = False) -> None:
        """SGLang's forward of the batch is done (or its call ended first), or SGLang took it
        to run batched (``handed``, the core keeps its predicted forward as backlog): the core
        starts the hand-off, and the next request may be planned."""
        if self.side.running is batch:
            (self.side.hand_over if handed else self.side.finish_batch)(batch, time.time())
            self.side.outbox.clear()  # its Handoff: SGLang moves the KV itself
            self._wake.set()

    async def _execute(self, batch: PrefillBatch, commits: list[SuffixCommitted]) -> None:
        req = batch.request
        q = self.queued.get(req.rid)
        outcome = PrefillOutcome(status="cancelled", detail="aborted")
        try:
            prefix = batch.prefix_tokens
            if (
                q is not None
                and commits
                and not await self._commit(q.half, commits[0].tokens, prefix)
            ):
                # The decode side does not know the split: prefill everything.
                self.side.stolen_tokens -= req.stolen
                req.stolen = 0
                prefix = req.prompt_len
            if q is not None and not q.outcome.done():
                if prefix > 0:
                    outcome = await self._call_pipelined(batch, q.half, prefix)
                else:
                    outcome = await self._forget(req.rid)
                if outcome.status == "done":
                    outcome = PrefillOutcome(status="done", stolen=req.stolen)
                    log.info(
                        "request %d prefill done: %d of %d tokens here, %d stolen",
                        req.rid, prefix, req.prompt_len, req.stolen,
                    )  # fmt: skip
        finally:
            self._forward_done(batch)
            self.side.transfer_done(req.rid)
            if q is not None and not q.outcome.done():
                q.outcome.set_result(outcome)

    async def _call_pipelined(
        self, batch: PrefillBatch, half: PrefillHalf, prefix: int
    ) -> PrefillOutcome:
        """SGLang's prefill of ``prompt_ids[:prefix]``; the batch's forward is reported done to
        the core as soon as the hook says so, while the call waits for the KV transfer."""
        call: asyncio.Task[PrefillOutcome] = asyncio.create_task(
            self.call(half, half.prompt_ids[:prefix])
        )
        forwarded = asyncio.create_task(self._forwarded(half.rid))
        try:
            await asyncio.wait({call, forwarded}, return_when=asyncio.FIRST_COMPLETED)
            self._forward_done(batch)
            return await call
        finally:
            forwarded.cancel()
            if not call.done():  # cancelled: the stop of the sidecar, or an abort
                call.cancel()
            for task in (call, forwarded):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _forwarded(self, rid: int) -> None:
        """Returns when the hook says SGLang's forward of ``rid`` is done (long polls)."""
        assert self._client is not None, "the planner is not started"
        body = {"rid": str(rid), "timeout": FORWARDED_POLL_S}
        timeout = aiohttp.ClientTimeout(total=FORWARDED_POLL_S + 5.0)
        while True:
            try:
                async with self._client.post(
                    f"{self.hook_url}/forwarded", json=body, timeout=timeout
                ) as r:
                    if r.status == 200 and (await r.json(content_type=None)).get("forwarded"):
                        return
                    if r.status != 200:
                        await asyncio.sleep(0.05)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                await asyncio.sleep(0.05)  # the call's own answer still ends the wait

    async def _commit(self, half: PrefillHalf, tokens: int, prefix: int) -> bool:
        commit = SuffixCommit(rid=half.rid, tokens=tokens, prefix=prefix)
        try:
            answer = await self.peers.post(half.decode_url, "/v1/internal/suffix", commit)
        except PeerError as exc:
            log.warning("suffix commit for %d not taken, prefilling it whole: %s", half.rid, exc)
            return False
        self.budgets[half.decode_worker] = float(answer.get("budget", 0.0))
        return True

    async def _forget(self, rid: int) -> PrefillOutcome:
        """p = 0: nothing runs here; SGLang's transfer engine would keep the decode side's
        destination list for the room, so the hook drops it."""
        assert self._client is not None, "the planner is not started"
        try:
            async with self._client.post(
                f"{self.hook_url}/forget", json={"room": rid}, timeout=aiohttp.ClientTimeout(5.0)
            ) as r:
                r.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("room %d not forgotten on the prefill server: %s", rid, exc)
        return PrefillOutcome(status="done")

    async def _refresh_budgets(self) -> None:
        """While the queue is under stealing pressure, keep its peers' budgets fresh."""
        while True:
            await asyncio.sleep(self.budget_refresh_s)
            if not self.token_cfg.enabled:
                continue
            wanted = self.side.budget_peers()
            await refresh_budgets(self.peers, wanted, self._decode_urls, self.budgets)


class DecodeSplits:
    """The decode sidecar's side: splits to the hook, and the advertised stealing budget."""

    def __init__(
        self, profile: Profile, slo: SLO, token_cfg: FluidTokenConfig, hook_url: str
    ) -> None:
        self.decode = profile.decode_predictor()
        self.suffix = profile.suffix_predictor()
        self.slo = slo
        self.token_cfg = token_cfg
        self.hook_url = hook_url
        #: Suffixes registered with the hook and not yet run: rid -> (tokens, the prompt
        #: tokens before them, when).
        self.pending: dict[int, tuple[int, int, float]] = {}
        self.n_prefill = 1
        self.output_clip = profile.kv.reserve_output_clip
        #: The decode halves handed to this worker, clocked in SGLang's steps (``n_steps``).
        self.intake = KvIntake()

    def take(self, snap: dict[str, Any], prompt_len: int, max_new_tokens: int) -> None:
        """A decode half was handed to this worker (it will reserve KV for it)."""
        self.intake.add(int(snap.get("n_steps", 0)), prompt_len, max_new_tokens, self.output_clip)

    async def register(self, client: aiohttp.ClientSession, body: SuffixCommit) -> None:
        """Tell the hook before the prefix KV can land (the prefill side waits for this):
        the suffix, the profile's prediction of its extend, of what its stream adds to each
        decode step (eq. 13) and the TPOT target, so that the extend waits for room in every
        running stream's TPOT (``fluidtoken_hook.Streams``)."""
        split = {
            "rid": str(body.rid),
            "suffix": body.tokens,
            "suffix_s": float(self.suffix.time(body.tokens, body.prefix)),
            "tpot": self.slo.tpot,
            "step_s": self.decode.added(body.prefix + body.tokens),
        }
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with client.post(f"{self.hook_url}/split", json=split, timeout=timeout) as r:
            if r.status != 200:
                text = (await r.text(errors="replace"))[:200]
                raise RuntimeError(f"SGLang's FluidToken hook refused the split: {text}")
        self.pending[body.rid] = (body.tokens, body.prefix, time.time())

    def pending_suffixes(self, snap: dict[str, Any]) -> list[tuple[int, int]]:
        """(tokens, prefix) of the registered suffixes not yet run (those the snapshot no
        longer lists have run, or were dropped)."""
        live = set(snap.get("fluid_pending") or [])
        t = float(snap.get("t", 0.0))
        for rid, (_, _, at) in list(self.pending.items()):
            if str(rid) not in live and t > at:
                del self.pending[rid]
        return [(tokens, prefix) for tokens, prefix, _ in self.pending.values()]

    def budget(self, snap: dict[str, Any], report: PressureReport, admitting: bool) -> float:
        """B_d^steal (eq. 17) from SGLang's decode state; 0 while requests wait for KV room
        (decode admission is then the bottleneck)."""
        blocked = int(snap.get("prealloc_blocked", 0)) > 0
        step, capacity = int(snap.get("n_steps", 0)), int(snap.get("kv_capacity", 0))
        return advertised_budget(
            self.slo.tpot,
            self.decode,
            self.suffix,
            int(snap.get("decode_batch", 0)),
            int(snap.get("decode_context", 0)),
            self.pending_suffixes(snap),
            report.dpi_load,
            self.n_prefill,
            self.token_cfg,
            admitting and not blocked and self.token_cfg.enabled,
            self.intake.forecast(step, capacity) if capacity > 0 else 0.0,
        )
