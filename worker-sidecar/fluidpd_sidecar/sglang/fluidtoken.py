"""FluidToken for the ``sglang`` engine, on the sidecar side (FluidPD's interpreter).

Prefill (``PrefillPlanner``): the core's ``PrefillSide`` (``fluidpd.core.scheduler.prefill``:
FIFO, one request at a time, Algorithm 1 over the waiting queue with the paired decode
workers' budgets, or ``--force-steal``) decides each request's split at its scheduling
iteration, exactly as for the other engines; the sidecar then sends SGLang's prefill server
only ``input_ids[:p]`` (nothing when p = 0, and the prefill hook forgets the room). Before
that, the stolen count goes to the decode sidecar (``POST /v1/internal/suffix``, the same
message the other engines send), which registers it with its SGLang's FluidToken hook
(``fluidtoken_hook``): the split is known there before the prefix KV can land. If that fails,
the whole prompt is prefilled instead (always safe: the decode side would at worst recompute
a suffix whose KV it already has).

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from fluidpd.api.internal import PrefillHalf, PrefillOutcome, PressureReport, SuffixCommit
from fluidpd.core.fluidtoken import FluidTokenConfig, advertised_budget
from fluidpd.core.profile import Profile
from fluidpd.core.scheduler.messages import SuffixCommitted
from fluidpd.core.scheduler.prefill import PrefillBatch, PrefillSide
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.types import SLO, Request, Role
from fluidpd_sidecar.peers import PeerError, Peers, refresh_budgets

log = logging.getLogger("fluidpd.sidecar.sglang")

#: Sends ``ids`` (a prefix of the half's prompt) to SGLang's prefill server and waits for it.
PrefillCall = Callable[[PrefillHalf, list[int]], Awaitable[PrefillOutcome]]


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
    ) -> None:
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
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="fluidtoken-prefill"),
            asyncio.create_task(self._refresh_budgets(), name="fluidtoken-budgets"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

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
            if self.side.running is not None and self.side.running.request.rid == half.rid:
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
                budgets = self._budget_source if self.token_cfg.enabled else None
                batch = self.side.next_batch(time.time(), budgets)
                if batch is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._execute(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the queue; log and go on
                log.exception("FluidToken prefill iteration failed")
                await asyncio.sleep(0.01)

    async def _execute(self, batch: PrefillBatch) -> None:
        req = batch.request
        q = self.queued.get(req.rid)
        commits = [m for m in self.side.outbox if isinstance(m, SuffixCommitted)]
        self.side.outbox.clear()
        prefix = batch.prefix_tokens
        if q is not None and commits and not await self._commit(q.half, commits[0].tokens):
            # The decode side does not know the split: prefill everything.
            self.side.stolen_tokens -= req.stolen
            req.stolen = 0
            prefix = req.prompt_len
        outcome = PrefillOutcome(status="cancelled", detail="aborted")
        try:
            if q is not None and not q.outcome.done():
                if prefix > 0:
                    outcome = await self.call(q.half, q.half.prompt_ids[:prefix])
                else:
                    outcome = await self._forget(req.rid)
                if outcome.status == "done":
                    outcome = PrefillOutcome(status="done", stolen=req.stolen)
                    log.info(
                        "request %d prefill done: %d of %d tokens here, %d stolen",
                        req.rid, prefix, req.prompt_len, req.stolen,
                    )  # fmt: skip
        finally:
            self.side.finish_batch(batch, time.time())
            self.side.outbox.clear()  # its Handoff: SGLang moves the KV itself
            self.side.transfer_done(req.rid)
            if q is not None and not q.outcome.done():
                q.outcome.set_result(outcome)

    async def _commit(self, half: PrefillHalf, tokens: int) -> bool:
        try:
            answer = await self.peers.post(
                half.decode_url, "/v1/internal/suffix", SuffixCommit(rid=half.rid, tokens=tokens)
            )
        except PeerError as exc:
            log.warning("suffix commit for %d not taken, prefilling it whole: %s", half.rid, exc)
            return False
        self.budgets[half.decode_worker] = float(answer.get("budget", 0.0))
        return True

    async def _forget(self, rid: int) -> PrefillOutcome:
        """p = 0: nothing runs here; SGLang's transfer engine would keep the decode side's
        destination list for the room, so the hook drops it."""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as c,
                c.post(f"{self.hook_url}/forget", json={"room": rid}) as r,
            ):
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
        #: Suffix tokens registered with the hook and not yet run: rid -> (tokens, when).
        self.pending: dict[int, tuple[int, float]] = {}
        self.n_prefill = 1

    async def register(self, client: aiohttp.ClientSession, body: SuffixCommit) -> None:
        """Tell the hook before the prefix KV can land (the prefill side waits for this)."""
        split = {"rid": str(body.rid), "suffix": body.tokens}
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with client.post(f"{self.hook_url}/split", json=split, timeout=timeout) as r:
            if r.status != 200:
                text = (await r.text(errors="replace"))[:200]
                raise RuntimeError(f"SGLang's FluidToken hook refused the split: {text}")
        self.pending[body.rid] = (body.tokens, time.time())

    def pending_tokens(self, snap: dict[str, Any]) -> int:
        """Registered suffix tokens the snapshot no longer lists have run (or were dropped)."""
        live = set(snap.get("fluid_pending") or [])
        t = float(snap.get("t", 0.0))
        for rid, (_, at) in list(self.pending.items()):
            if str(rid) not in live and t > at:
                del self.pending[rid]
        return sum(tokens for tokens, _ in self.pending.values())

    def budget(self, snap: dict[str, Any], report: PressureReport, admitting: bool) -> float:
        """B_d^steal (eq. 17) from SGLang's decode state; 0 while requests wait for KV room
        (decode admission is then the bottleneck)."""
        blocked = int(snap.get("prealloc_blocked", 0)) > 0
        return advertised_budget(
            self.slo.tpot,
            self.decode,
            self.suffix,
            int(snap.get("decode_batch", 0)),
            int(snap.get("decode_context", 0)),
            self.pending_tokens(snap),
            report.dpi_load,
            self.n_prefill,
            self.token_cfg,
            admitting and not blocked and self.token_cfg.enabled,
        )
