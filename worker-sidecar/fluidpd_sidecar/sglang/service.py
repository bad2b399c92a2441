"""The sidecar of an ``sglang`` worker: SGLang schedules and computes, the sidecar supervises
it, speaks FluidPD's P/D protocol to the router and serves FluidPD's signals.

Request path (SGLang's own P/D disaggregation, KV over its Mooncake transfer backend): the
prefill sidecar sends its half to its SGLang server (``disaggregation-mode prefill``) with the
bootstrap triple and answers the router when SGLang has computed and shipped the prompt's KV;
the decode sidecar looks up the prefill server's bootstrap address from the prefill sidecar
(``GET /v1/internal/sglang``), streams its SGLang server's tokens (``disaggregation-mode
decode``), detokenizes and stops them (``fluidpd_sidecar.stopping``), and streams
``DecodeEvent`` lines to the router, exactly as the other engines' sidecars do.

FluidToken (``fluidtoken``): the prefill sidecar's core scheduler decides each request's split
and sends SGLang only the prefix; the decode sidecar registers the split with SGLang's
FluidToken hook, which runs the suffix as a real extend. ``--no-fluidtoken`` without
``--force-steal`` sends every half straight to SGLang (beta = 0, SGLang's own batching).
FluidRole: ``POST /role`` switches the running SGLang server in place (``fluidrole`` drives
the core's role state machine, ``roleswitch`` flips SGLang's scheduler); drain ``wait`` only
(``migrate`` falls back to it). ``/pressure`` and ``/metrics`` come from the scheduler hook
(``observe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fluidpd.api.internal import (
    Abort,
    DecodeEvent,
    DecodeHalf,
    FluidTokenSetting,
    PrefillHalf,
    PrefillOutcome,
    PressureReport,
    RequestHalf,
    RetireRequest,
    RoleRequest,
    RoleStatus,
    SuffixCommit,
)
from fluidpd.core.types import Request, Role
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.config import SidecarConfig
from fluidpd_sidecar.errors import BadRequest, Conflict
from fluidpd_sidecar.halves import check_half, log_admitted, log_decode_end, spares_started
from fluidpd_sidecar.metrics import SidecarMetrics
from fluidpd_sidecar.peers import Peers
from fluidpd_sidecar.sglang.fluidrole import RoleDriver, SwitchGauges
from fluidpd_sidecar.sglang.fluidtoken import DEFAULT_WINDOW, DecodeSplits, PrefillPlanner
from fluidpd_sidecar.sglang.observe import pressure_report, step_gauges
from fluidpd_sidecar.sglang.server import SglangError, SglangServer
from fluidpd_sidecar.sglang.wire import generate_body, new_tokens
from fluidpd_sidecar.stopping import OutputStream

log = logging.getLogger("fluidpd.sidecar.sglang")
#: Reading the hook's snapshot.
_SHORT = aiohttp.ClientTimeout(total=2.0)
#: Asking the prefill sidecar for its bootstrap address; asking SGLang to abort a request.
_PEER = aiohttp.ClientTimeout(total=5.0)


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """A streamed body's lines, of any length. SGLang's streamed answers are cumulative (every
    chunk repeats the ids and log-probabilities so far), so a long output's lines outgrow the
    128 KiB that aiohttp's own line iterator allows."""
    buf = bytearray()
    async for chunk in content.iter_any():
        buf.extend(chunk)
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            yield buf[start:end].rstrip(b"\r").decode(errors="replace")
            start = end + 1
        del buf[:start]
    if buf:
        yield buf.decode(errors="replace")


#: The decode hook's FluidToken counters (``fluidtoken_hook._stats``): Prometheus name, help.
SUFFIX_COUNTERS = {
    "extends": ("fluidpd_sglang_suffix_extends",
                "Stolen suffixes the decode server's hook ran as extends"),
    "extend_tokens": ("fluidpd_sglang_suffix_extend_tokens", "Their prompt tokens"),
    "held": ("fluidpd_sglang_suffix_held_iterations",
             "Decode iterations a waiting suffix was held for a running stream's TPOT room"),
    "extend_seconds": ("fluidpd_sglang_suffix_extend_seconds",
                       "Seconds the extends ran, measured in the scheduler"),
    "extend_predicted_seconds": ("fluidpd_sglang_suffix_extend_predicted_seconds",
                                 "Seconds the decode sidecar predicted for them"),
}  # fmt: skip


class _StepGauges(Collector):
    """Step times from the hook (``/metrics``), read at scrape time."""

    def __init__(self, service: SglangService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        worker = self.service.cfg.worker_id
        med = GaugeMetricFamily(
            "fluidpd_sglang_step_seconds",
            "Median wall time of SGLang's recent scheduler steps (run_batch), by kind",
            labels=["worker", "kind"],
        )
        n = GaugeMetricFamily(
            "fluidpd_sglang_recent_steps", "Steps in that window", labels=["worker", "kind"]
        )
        for kind, (seconds, count) in step_gauges(self.service.snapshot).items():
            med.add_metric([worker, kind], seconds)
            n.add_metric([worker, kind], float(count))
        yield med
        yield n
        planner = self.service.planner
        for name, doc, value in (
            ("fluidpd_sglang_prefill_in_flight",
             "Requests FluidToken's planner has in SGLang's prefill server (computing or "
             "sending KV)", planner.in_flight),
            ("fluidpd_sglang_prefill_in_flight_max", "Most of them at once so far",
             planner.max_in_flight),
            ("fluidpd_sglang_prefill_overlapped",
             "Requests released while another was still in SGLang's prefill server",
             planner.overlapped),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, doc, labels=["worker"])
            g.add_metric([worker], float(value))
            yield g
        counts = self.service.suffix_counts()
        for key, (name, doc) in SUFFIX_COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["worker"])
            c.add_metric([worker], float(counts[key]))
            yield c


@dataclass(slots=True)
class _Half:
    req: Request
    events: asyncio.Queue[DecodeEvent | None] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    #: The prefill peer of a decode half (a draining decode worker asks it to release).
    prefill_url: str = ""

    @property
    def started(self) -> bool:
        """A decode half whose first token came out of SGLang: its KV arrived and it decodes,
        so it can finish without its prefill half (an ``unless_started`` abort spares it). The
        KV's arrival itself is not seen from here (SGLang's own transfer); until that first
        token the half counts as not started, and such an abort cancels it as before."""
        return not math.isnan(self.req.first_token_t)


def _end(state: _Half, rid: int, event: DecodeEvent) -> None:
    """The last event of a decode half, logged as every sidecar logs a half's end."""
    log_decode_end(rid, event)
    state.events.put_nowait(event)


class SglangService:
    def __init__(
        self,
        cfg: SidecarConfig,
        server: SglangServer,
        text: TokenText,
        *,
        exit_on_failure: bool = True,
        prefill_window: int = DEFAULT_WINDOW,
        prefill_batching: bool = False,
    ) -> None:
        self.cfg = cfg
        self.server = server
        self.text = text
        self.exit_on_failure = exit_on_failure
        #: Set when SGLang could not be started or died for good (NotReady with this reason).
        self.failed: str | None = None
        self.halves: dict[int, _Half] = {}
        self._bootstraps: dict[str, tuple[str, int]] = {}
        #: The hook's last snapshot of SGLang's scheduler (``fluidpd_sidecar.sglang.hook``).
        self.snapshot: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._client: aiohttp.ClientSession | None = None
        self.metrics = SidecarMetrics(self)  # type: ignore[arg-type]  # same surface it reads
        self.metrics.registry.register(_StepGauges(self))
        self.n_prefill = 1
        self.peers = Peers(cfg.admin_token)
        hook_url = f"http://127.0.0.1:{server.cfg.hook_port}"
        self.planner = PrefillPlanner(
            cfg.worker_id, cfg.profile, cfg.slo, cfg.token_cfg, cfg.force_steal, self.peers,
            self._prefill_sglang, self._abort_sglang, hook_url, cfg.budget_refresh_s,
            prefill_window, prefill_batching,
        )  # fmt: skip
        self.splits = DecodeSplits(cfg.profile, cfg.slo, cfg.token_cfg, hook_url)
        self.fluidrole = RoleDriver(self)
        self.metrics.registry.register(SwitchGauges(self.fluidrole))

    @property
    def role(self) -> Role:
        return self.fluidrole.role

    @property
    def retiring(self) -> bool:
        return self.fluidrole.sm.retiring

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self._client is not None, "the service is not started"
        return self._client

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        # No overall limit: a prefill answers when its KV is shipped, a decode streams for as
        # long as the request runs.
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5.0))
        self._tasks = [
            asyncio.create_task(self._supervise(), name="sglang-supervisor"),
            asyncio.create_task(self._poll_hook(), name="sglang-hook-poller"),
        ]
        self.planner.start()

    async def stop(self) -> None:
        await self.fluidrole.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.planner.stop()
        await self.peers.close()
        await self.server.stop()
        if self._client is not None:
            await self._client.close()

    def _fail(self, reason: str) -> None:
        self.failed = reason
        log.error("sglang: %s", reason)
        if self.exit_on_failure:
            # The CLI turns this into one line and a non-zero exit (``fluidpd sidecar``).
            os.kill(os.getpid(), signal.SIGTERM)

    async def _supervise(self) -> None:
        try:
            await self.server.start()
        except SglangError as exc:
            self._fail(str(exc))
            return
        await self.server.watch()
        if self.server.failed:
            self._fail(self.server.failed)

    async def _poll_hook(self) -> None:
        """The hook's snapshot, refreshed every 50 ms (the router polls /pressure at 2 Hz and
        the controller reads it; scraping must not wait on SGLang)."""
        assert self._client is not None
        while True:
            if self.server.healthy:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    await self.refresh_snapshot()
                await self.fluidrole.sync_engine()
            await asyncio.sleep(0.05)

    async def refresh_snapshot(self) -> None:
        url = f"http://127.0.0.1:{self.server.cfg.hook_port}/"
        async with self.client.get(url, timeout=_SHORT) as r:
            if r.status == 200:
                self.snapshot = await r.json(content_type=None)

    def ready(self) -> tuple[bool, str]:
        if self.failed:
            return False, f"SGLang failed: {self.failed}"
        if not self.server.healthy:
            return False, "SGLang starting" if self.server.starts <= 1 else "SGLang restarting"
        if self.retiring:
            return False, "retiring"
        if self.fluidrole.sm.accepting and not self.fluidrole.engine_in_role():
            return False, f"SGLang starting as {self.role.value}"
        return True, "ready"

    # -- signals ------------------------------------------------------------------------------
    @property
    def fluidtoken(self) -> bool:
        """Halves go through FluidToken's planner (else straight to SGLang, beta = 0)."""
        return self.cfg.token_cfg.enabled or self.planner.side.forced_steal is not None

    def fluidtoken_setting(self) -> FluidTokenSetting:
        return FluidTokenSetting(force_steal=self.planner.side.forced_steal)

    def set_fluidtoken(self, body: FluidTokenSetting) -> FluidTokenSetting:
        """``--force-steal`` at run time: an operator pins (or frees) the P/D split of the
        prompts this worker starts from now on without restarting its SGLang server (minutes);
        the ones already in SGLang keep theirs. On a decode worker it is kept for when it
        switches to prefill."""
        if body.force_steal is not None and self.server.cfg.overlap_schedule:
            raise Conflict(
                f"worker {self.cfg.worker_id}: its SGLang server runs the overlap scheduler "
                "(started without FluidToken), which cannot run a stolen suffix"
            )
        before = self.planner.side.forced_steal
        self.planner.side.forced_steal = body.force_steal
        log.info("FluidToken force_steal %s -> %s", before, body.force_steal)
        return self.fluidtoken_setting()

    def pressure(self, n_prefill: int | None = None) -> PressureReport:
        if n_prefill:
            self.n_prefill = self.splits.n_prefill = n_prefill
        arrivals = {str(rid): h.req.arrival for rid, h in self.halves.items()}
        snap = self.snapshot
        if self.role is Role.PREFILL and self.planner.queued:
            # Held by the planner, not yet given to SGLang: schedulable (SGLang's own bootstrap
            # gates the one it runs), so prefill pressure like SGLang's waiting queue.
            snap = {**snap, "waiting": [*snap.get("waiting", []),
                                        *self.planner.queue_entries()]}  # fmt: skip
        report = pressure_report(
            snap,
            worker=self.cfg.worker_id,
            role=self.role,
            profile=self.cfg.profile,
            slo=self.cfg.slo,
            arrivals=arrivals,
            now=time.time(),
            retiring=self.retiring,
            in_flight=len(self.halves),
        )
        if self.role is Role.PREFILL:
            report = report.model_copy(update={"stolen_tokens": self.planner.stolen_tokens})
        else:
            budget = self.splits.budget(snap, report, admitting=not self.retiring)
            report = report.model_copy(update={"steal_budget": budget})
        return self.fluidrole.report(report)

    def budget(self) -> float:
        return self.pressure().steal_budget if self.role is Role.DECODE else 0.0

    async def suffix_committed(self, body: SuffixCommit) -> float:
        """A prefill peer stole ``tokens`` of this request's prompt: SGLang's FluidToken hook
        must know before the prefix KV lands (the peer waits for this answer)."""
        if self.role is not Role.DECODE:
            raise Conflict(f"worker {self.cfg.worker_id} is {self.role.value}, not decode")
        assert self._client is not None
        try:
            await self.splits.register(self._client, body)
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            raise BadRequest(f"split of request {body.rid} not registered: {exc}") from exc
        return self.budget()

    def role_status(self) -> RoleStatus:
        return self.fluidrole.status()

    def request_role(self, body: RoleRequest) -> RoleStatus:
        return self.fluidrole.request(body)

    def retire(self, body: RetireRequest | None = None) -> RoleStatus:
        """Scale-in: take no more halves; /pressure says ``drained`` once none is in flight."""
        return self.fluidrole.retire(body or RetireRequest())

    def cancel_retire(self) -> RoleStatus:
        return self.fluidrole.cancel_retire()

    async def release(self, rid: int) -> bool:
        return await self.fluidrole.release(rid)

    def bootstrap_info(self) -> dict[str, Any]:
        cfg = self.server.cfg
        return {
            # SGLang's live role (a FluidRole worker is launched as decode and flipped).
            "mode": self.snapshot.get("mode", cfg.mode),
            "bootstrap_host": urlparse(self.cfg.url).hostname or cfg.host,
            "bootstrap_port": cfg.bootstrap_port,
            "pid": self.server.pid,
            # The scheduler process, where a role switch happens (the hook's own pid).
            "scheduler_pid": self.snapshot.get("pid"),
            "url": cfg.url,
            "start_s": self.server.start_s,
            "restarts": self.server.restarts,
            "prefill_window": self.planner.window,
            "prefill_batching": self.planner.batching,
            "prefill_in_flight": self.planner.in_flight,
            "prefill_in_flight_max": self.planner.max_in_flight,
            "prefill_overlapped": self.planner.overlapped,
            "suffix": self.suffix_counts(),
        }

    def suffix_counts(self) -> dict[str, float]:
        """The decode hook's counters (``SUFFIX_COUNTERS``), as its last snapshot says."""
        fluid = self.snapshot.get("fluid") or {}
        return {key: float(fluid.get(key, 0)) for key in SUFFIX_COUNTERS}

    # -- request halves -----------------------------------------------------------------------
    def _check(self, half: RequestHalf, role: Role) -> None:
        if self.role is not role:
            raise Conflict(f"worker {self.cfg.worker_id} is {self.role.value}, not {role.value}")
        if not self.fluidrole.sm.accepting:
            state = self.fluidrole.sm.state.value
            raise Conflict(f"worker {self.cfg.worker_id} is {state}; not taking work")
        ok, why = self.ready()
        if not ok:
            raise Conflict(f"worker {self.cfg.worker_id} not taking work: {why}")
        if half.rid in self.halves:
            raise Conflict(f"request {half.rid} is already here")
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)

    def _own_bootstrap(self) -> tuple[str, int] | None:
        info = self.bootstrap_info()
        if info["bootstrap_port"] is None:
            return None
        return str(info["bootstrap_host"]), int(info["bootstrap_port"])

    async def accept_prefill(self, half: PrefillHalf) -> PrefillOutcome:
        self._check(half, Role.PREFILL)
        state = _Half(Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens))
        self.halves[half.rid] = state
        log_admitted(half)
        try:
            if self.fluidtoken:
                outcome = await self.planner.prefill(half)
            else:
                outcome = await self._prefill_sglang(half, half.prompt_ids)
        finally:
            self.halves.pop(half.rid, None)
            self.fluidrole.repair.discard(half.rid)
        if outcome.status == "done":
            log.info("request %d prefill done: %d stolen", half.rid, outcome.stolen)
        else:
            log.info("request %d prefill half %s: %s", half.rid, outcome.status, outcome.detail)
        return outcome

    async def _prefill_sglang(self, half: PrefillHalf, ids: list[int]) -> PrefillOutcome:
        """``ids`` (the prompt, or the prefix FluidToken left here) through SGLang's prefill
        server; its answer comes once the KV has gone to the decode server."""
        body = generate_body(half.rid, ids, half.sampling, self._own_bootstrap(), stream=False)
        try:
            assert self._client is not None
            async with self._client.post(f"{self.server.cfg.url}/generate", json=body) as r:
                if r.status != 200:
                    text = await r.text(errors="replace")
                    return PrefillOutcome(status="cancelled", detail=f"SGLang: {text[:200]}")
                meta = (await r.json(content_type=None)).get("meta_info") or {}
            if (meta.get("finish_reason") or {}).get("type") == "abort":
                if half.rid in self.fluidrole.repair:  # turned back by a drain: pair again
                    return PrefillOutcome(status="reroute", detail="worker draining")
                return PrefillOutcome(status="cancelled", detail="aborted")
            return PrefillOutcome(status="done", stolen=0)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return PrefillOutcome(status="cancelled", detail=f"SGLang unreachable: {exc}")
        except asyncio.CancelledError:
            await self._abort_sglang(half.rid)
            raise

    async def peer_post(self, url: str, path: str, body: Abort) -> dict[str, Any]:
        return await self.peers.post(url, path, body)

    async def _peer_bootstrap(self, prefill_url: str) -> tuple[str, int]:
        hit = self._bootstraps.get(prefill_url)
        if hit is not None:
            return hit
        assert self._client is not None
        headers = {}
        if self.cfg.admin_token:
            headers["Authorization"] = f"Bearer {self.cfg.admin_token}"
        async with self._client.get(
            f"{prefill_url.rstrip('/')}/v1/internal/sglang", headers=headers, timeout=_PEER
        ) as r:
            r.raise_for_status()
            info = await r.json(content_type=None)
        if info.get("bootstrap_port") is None:
            raise RuntimeError(f"{prefill_url} is not an SGLang prefill worker")
        hit = (str(info["bootstrap_host"]), int(info["bootstrap_port"]))
        self._bootstraps[prefill_url] = hit
        return hit

    def accept_decode(self, half: DecodeHalf) -> AsyncIterator[bytes]:
        self._check(half, Role.DECODE)
        state = _Half(Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens))
        state.prefill_url = half.prefill_url
        self.halves[half.rid] = state
        self.splits.take(self.snapshot, half.prompt_len, half.max_new_tokens)
        log_admitted(half)
        state.task = asyncio.create_task(self._decode(half, state), name=f"decode-{half.rid}")
        return self._events(half.rid, state)

    async def _decode(self, half: DecodeHalf, state: _Half) -> None:
        stream = OutputStream(self.text, half.sampling, self.cfg.model.eos_token_ids)
        req = state.req
        seen = 0
        try:
            bootstrap = await self._peer_bootstrap(half.prefill_url)
            body = generate_body(half.rid, half.prompt_ids, half.sampling, bootstrap, stream=True)
            assert self._client is not None
            async with self._client.post(f"{self.server.cfg.url}/generate", json=body) as r:
                if r.status != 200:
                    detail = (await r.read()).decode(errors="replace")[:200]
                    _end(state, half.rid, DecodeEvent(event="error", detail=f"SGLang: {detail}"))
                    return
                async for line in _lines(r.content):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    tokens = new_tokens(orjson.loads(data), seen)
                    if not tokens:
                        continue
                    seen += len(tokens)
                    now = time.time()
                    if req.first_token_t != req.first_token_t:  # NaN: this is token 0
                        req.first_token_t = now
                        self.metrics.first_token(now - req.arrival)
                    stopped = stream.feed(tokens)
                    self._emit(state, stream, now)
                    if stopped:
                        break
            if stream.finish is None:
                stream.end()
            now = time.time()
            self._emit(state, stream, now, final=True)
            self.metrics.finished(req, now, stream.count)
            _end(
                state,
                half.rid,
                DecodeEvent(
                    event="done", n=stream.count, finish_reason=stream.finish or "length", t=now
                ),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if half.rid in self.fluidrole.repair and not seen:  # turned back by a drain
                _end(state, half.rid, DecodeEvent(event="reroute", detail="worker draining"))
                return
            _end(state, half.rid, DecodeEvent(event="error", detail=str(exc)[:300]))
        finally:
            if seen < half.max_new_tokens and stream.finish is not None:
                # Stopped by FluidPD (a stop string) before SGLang would have: free it there.
                await self._abort_sglang(half.rid)
            self.fluidrole.repair.discard(half.rid)
            state.events.put_nowait(None)

    def _emit(self, state: _Half, stream: OutputStream, t: float, final: bool = False) -> None:
        ids, text, logprobs = stream.take(final)
        if ids or text:
            state.events.put_nowait(
                DecodeEvent(
                    event="token", n=stream.count, ids=ids, text=text, logprobs=logprobs, t=t
                )
            )

    async def _events(self, rid: int, state: _Half) -> AsyncIterator[bytes]:
        try:
            while True:
                event = await state.events.get()
                if event is None:
                    return
                yield event.model_dump_json().encode() + b"\n"
        finally:
            self.halves.pop(rid, None)
            if state.task is not None and not state.task.done():
                state.task.cancel()  # the router went away: closing SGLang's stream aborts it

    async def abort_sglang(self, rid: int) -> None:
        await self._abort_sglang(rid)

    async def _abort_sglang(self, rid: int) -> None:
        if self._client is None:
            return
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._client.post(
                f"{self.server.cfg.url}/abort_request", json={"rid": str(rid)}, timeout=_PEER
            ):
                pass

    async def abort(self, body: Abort) -> bool:
        state = self.halves.get(body.rid)
        if state is not None and state.task is not None and spares_started(body, state.started):
            return False  # a decode half that decodes already: not even SGLang is told
        await self._abort_sglang(body.rid)
        if state is None:
            return False
        if state.task is not None and not state.task.done():
            state.task.cancel()
            _end(state, body.rid, DecodeEvent(event="cancelled", detail=body.reason))
            state.events.put_nowait(None)
        return True
