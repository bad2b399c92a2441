"""Open-loop replay of a workload against an OpenAI-compatible streaming endpoint.

Every request is sent at its workload arrival time (relative to the replay start) whether or not
earlier ones have finished, so a slow server sees the load the trace describes instead of a
client that politely waits (open loop, as ``sglang.bench_serving`` with a request rate).

Timing follows ``sglang.bench_serving`` (``shared/notes/performance-anchors.md`` §4): TTFT is the
first stream chunk with non-empty text, the finish is the end of the stream, and the output length
is the server's final ``usage.completion_tokens`` (else the number of non-empty chunks). One
deliberate difference: latencies count from the request's *scheduled* send time, not the moment
the client got round to it, so client lag or a ``max_concurrency`` wait is charged to the request
rather than silently hidden (the actual send lag is reported next to the results).

Like the simulator, a request that has no first token ``timeout_s`` after its arrival is cancelled
(its connection is closed, which SGLang and vLLM take as an abort) and counted failed.

SIGTERM or SIGINT (``timeout``, a job's time limit, Ctrl-C) stops the replay without losing what
it measured: nothing more is sent, the streams in flight are closed and counted failed
("interrupted"), and the result says so (``ReplayResult.stopped``) and how many requests were
offered, so that the caller can measure the run over the requests it sent. A replay of long
prompts on an overloaded GPU, cut by its wrapper's time limit, used to end with no results.

All timestamps come from :func:`time.perf_counter` and are stored as seconds since the replay
start. The per-chunk path does one ``json.loads`` and a few dict lookups; bodies are encoded
before their send time; progress is published by a 4 Hz ticker rather than per event.

The streams go through aiohttp (as in ``sglang.bench_serving``), not httpx. Measured on the
H200 host (16 cores) against a 12-process fake server answering in 0.1 s + 20 ms/token: httpx
(httpcore + h11 + anyio, all pure Python) spent 180-270 us of client CPU per SSE chunk,
saturated its core at ~3,500 chunks/s and reported a p99 TTFT of 8.4 s at 50 req/s; with aiohttp
(C parser, 20-40 us per chunk) the same client measured p99 TTFT 104 / 116 ms and exact TPOT at
50 / 200 req/s (4,300 / 15,000 chunks/s, ~560 concurrent streams). The few control calls outside
the replay (``/v1/models``, the ``/admin/stats`` probes before and after) use aiohttp too, each on a
short event loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import aiohttp

from fluidpd.replay.prompts import API_PATHS, Api, PromptFormat, request_body
from fluidpd.sim.workloads import Workload

__all__ = [
    "EndpointUnreachable",
    "Outcome",
    "Progress",
    "ReplayConfig",
    "ReplayResult",
    "StatsSample",
    "fetch_admin_stats",
    "list_models",
    "replay",
]

ADMIN_STATS_PATH = "/admin/stats"
MODELS_PATH = "/v1/models"
_PROGRESS_PERIOD_S = 0.25
_ADMIN_TIMEOUT_S = 2.0
_MAX_MESSAGE = 160


class EndpointUnreachable(Exception):
    """No HTTP connection could be made to the endpoint (one-line message)."""


def _one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


async def _get_json(url: str, api_key: str, timeout_s: float) -> tuple[int, Any]:
    # The session ignores proxy variables (aiohttp's trust_env=False), as the replay's streams
    # do, so the preflight checks the same path the replay will use.
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=auth_headers(api_key)) as session,
        session.get(url) as resp,
    ):
        if resp.status != 200:
            return resp.status, None
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, None


def _get(url: str, api_key: str, timeout_s: float) -> tuple[int, Any]:
    """One GET before or after the replay (no event loop runs then): (HTTP status, the JSON body
    of a 200, else None). Raises ``aiohttp.ClientError`` or ``TimeoutError`` when nothing
    answers."""
    return asyncio.run(_get_json(url, api_key, timeout_s))


def list_models(endpoint: str, api_key: str, timeout_s: float = 10.0) -> tuple[int, list[str]]:
    """``GET /v1/models``: (HTTP status, model ids; empty unless a 200 with an OpenAI model list).

    Raises :class:`EndpointUnreachable` when nothing answers, so callers can stop before a replay.
    """
    try:
        status, doc = _get(endpoint + MODELS_PATH, api_key, timeout_s)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise EndpointUnreachable(
            f"cannot reach {endpoint}: {_one_line(str(exc) or type(exc).__name__)}"
        ) from None
    ids: list[str] = []
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(data, list):
        ids = [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
    return status, ids


def fetch_admin_stats(endpoint: str, api_key: str) -> dict[str, Any] | None:
    """The FluidPD router's ``GET /admin/stats``, or None for any other server (404, no JSON,
    connection trouble): the stats are optional and must never stop a replay."""
    try:
        _, doc = _get(endpoint + ADMIN_STATS_PATH, api_key, _ADMIN_TIMEOUT_S)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    endpoint: str  # base URL without a trailing slash
    api: Api
    model: str  # the served model name sent in each body
    prompt_format: PromptFormat
    seed: int
    timeout_s: float
    api_key: str = "none"
    max_concurrency: int | None = None
    #: Sample ``/admin/stats`` every this many seconds (None: the endpoint has none).
    stats_interval_s: float | None = None


@dataclass(slots=True)
class Outcome:
    """One request; times are seconds since the replay start (NaN when it never happened)."""

    index: int
    scheduled: float
    prompt_len: int
    max_tokens: int
    sent: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    output_tokens: int = 0
    prompt_tokens: int | None = None  # the server's usage.prompt_tokens, when it reports one
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True, slots=True)
class Progress:
    total: int
    sent: int
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class StatsSample:
    t: float  # seconds since the replay start
    stats: dict[str, Any]


@dataclass(slots=True)
class ReplayResult:
    outcomes: list[Outcome]
    stats_before: dict[str, Any] | None
    samples: list[StatsSample]
    stats_after: dict[str, Any] | None
    wall_s: float
    event_loop: str = "asyncio"
    #: Why and when the replay was stopped early ("SIGTERM at 170.0 s"); None if it ran out.
    stopped: str | None = None
    #: The signal that stopped it (0 if none), for the caller's exit status.
    stop_signal: int = 0
    #: Requests whose send time came before the stop: a prefix of the workload (all if not
    #: stopped). Those in flight at the stop failed as "interrupted"; the rest were never sent.
    offered: int = 0


def _timeout_message(timeout_s: float) -> str:
    return f"timeout: no first token within {timeout_s:g} s"


def _http_error(status: int, raw: bytes) -> str:
    """``HTTP <status>: <server message>``; the message is pulled out of the usual OpenAI /
    FastAPI error shapes so that the error histogram groups identical failures."""
    message = raw.decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        if isinstance(doc, dict):
            err = doc.get("error", doc.get("detail", doc.get("message")))
            if isinstance(err, dict):
                err = err.get("message", err)
            if err is not None:
                message = str(err)
    message = _one_line(message, 100)
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def _stream_error(obj: dict[str, Any]) -> str | None:
    """The message of an error object sent inside a 200 stream (SGLang and vLLM do that when a
    request is aborted after the headers went out), else None."""
    err = obj.get("error")
    if err:
        msg = err.get("message", err) if isinstance(err, dict) else err
        return f"stream error: {_one_line(str(msg), 100)}"
    if obj.get("object") == "error":
        return f"stream error: {_one_line(str(obj.get('message', '')), 100)}"
    return None


def _completion_text(choice: dict[str, Any]) -> Any:
    return choice.get("text")


def _chat_text(choice: dict[str, Any]) -> Any:
    delta = choice.get("delta")
    if not delta:
        return None
    # Reasoning models stream their thinking as reasoning_content: still generated tokens.
    return delta.get("content") or delta.get("reasoning_content")


class _Replay:
    def __init__(
        self,
        workload: Workload,
        cfg: ReplayConfig,
        progress: Callable[[Progress], None] | None,
    ) -> None:
        self.workload = workload
        self.cfg = cfg
        self.progress = progress
        self.url = cfg.endpoint + API_PATHS[cfg.api]
        self.text_of = _chat_text if cfg.api == "chat" else _completion_text
        arrivals = workload.arrivals.tolist()
        prompts = workload.prompt_lens.tolist()
        outputs = workload.output_lens.tolist()
        self.outcomes = [
            Outcome(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))
        ]
        self.samples: list[StatsSample] = []
        self.t0 = 0.0
        self.sent = 0
        self.completed = 0
        self.failed = 0
        self._finished = asyncio.Event()
        # Stall detection after the first token: the stream stamps last_data per chunk (one list
        # store) and a watchdog cancels silent streams, instead of a timer per read.
        self.last_data = [0.0] * len(self.outcomes)
        self._streaming: dict[int, asyncio.Task[Any]] = {}
        self._stalled: set[int] = set()
        self._slots = (
            asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency is not None else None
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._scheduler: asyncio.Task[None] | None = None
        self.stopped: str | None = None
        self.stop_signal = 0

    # -- the replay -----------------------------------------------------------------------------
    async def run(self) -> None:
        cfg = self.cfg
        # One connection per in-flight stream (HTTP/1.1): no pool cap (0) unless the user asked
        # for one; idle connections are kept for reuse by later requests.
        connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0, limit_per_host=0)
        # Before the first token our own deadline (scheduled + timeout) bounds everything,
        # connecting and waiting for a pool slot included; afterwards the watchdog does. So the
        # session needs no timeouts of its own.
        timeout = aiohttp.ClientTimeout(total=None)
        headers = {
            **auth_headers(cfg.api_key),
            "Content-Type": "application/json",
            # Raw SSE bytes are split by hand, so the server must not compress them.
            "Accept-Encoding": "identity",
        }
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=headers, auto_decompress=False
        )
        # Sessions are built before the clock starts: creating one (its SSL context) blocks the
        # loop for tens of ms, which would delay the first sends.
        admin = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_ADMIN_TIMEOUT_S),
            headers=auth_headers(cfg.api_key),
        )
        async with session, admin:
            self.t0 = perf_counter()
            helpers = [
                asyncio.create_task(self._ticker()),
                asyncio.create_task(self._watchdog()),
            ]
            if cfg.stats_interval_s is not None:
                helpers.append(asyncio.create_task(self._sampler(admin, cfg.stats_interval_s)))
            loop = asyncio.get_running_loop()
            handled = _on_stop_signals(loop, self._stop)
            try:
                self._scheduler = asyncio.create_task(self._schedule(session))
                try:
                    await self._scheduler
                except asyncio.CancelledError:
                    if self.stopped is None:
                        raise
                ends = await asyncio.gather(*self._tasks, return_exceptions=True)
                if self.stopped is not None:
                    self._mark_interrupted()
                else:
                    for end in ends:
                        if isinstance(end, BaseException):
                            raise end
            finally:
                for sig in handled:
                    loop.remove_signal_handler(sig)
                self._finished.set()
                await asyncio.gather(*helpers, return_exceptions=True)
        self._publish()

    def _stop(self, sig: signal.Signals) -> None:
        """A stop signal: no more sends, and every request in flight fails as interrupted."""
        if self.stopped is not None:
            return
        self.stopped = f"{sig.name} at {perf_counter() - self.t0:.1f} s"
        self.stop_signal = int(sig)
        if self._scheduler is not None:
            self._scheduler.cancel()
        for task in self._tasks:
            task.cancel()

    @property
    def offered(self) -> int:
        """Requests whose send time came (all of them unless the replay was stopped)."""
        return len(self._tasks) if self.stopped is not None else len(self.outcomes)

    def _mark_interrupted(self) -> None:
        """Requests whose task the stop cancelled before it first ran never reached their own
        handler: they fail as interrupted here."""
        for task, out in zip(self._tasks, self.outcomes, strict=False):
            if task.cancelled() and out.error is None:
                out.error = f"interrupted: the replay was stopped ({self.stopped})"
                self.failed += 1

    async def _schedule(self, session: aiohttp.ClientSession) -> None:
        cfg = self.cfg
        for out in self.outcomes:
            # Encode the body while waiting for the send time, not after it.
            body = request_body(
                api=cfg.api,
                model=cfg.model,
                prompt_format=cfg.prompt_format,
                seed=cfg.seed,
                index=out.index,
                prompt_len=out.prompt_len,
                max_tokens=out.max_tokens,
            )
            delay = self.t0 + out.scheduled - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self._tasks.append(asyncio.create_task(self._request(session, out, body)))

    async def _request(self, session: aiohttp.ClientSession, out: Outcome, body: bytes) -> None:
        remaining = self.t0 + out.scheduled + self.cfg.timeout_s - perf_counter()
        acquired = False
        try:
            async with asyncio.timeout(remaining) as deadline:
                if self._slots is not None:
                    await self._slots.acquire()
                    acquired = True
                out.sent = perf_counter() - self.t0
                self.sent += 1
                async with session.post(self.url, data=body) as resp:
                    if resp.status != 200:
                        out.error = _http_error(resp.status, await resp.read())
                        return
                    await self._read_stream(resp, out, deadline)
        except TimeoutError:
            # Ours (the first-token deadline): the session itself has no timeouts.
            out.error = _timeout_message(self.cfg.timeout_s)
        except asyncio.CancelledError:
            if out.index in self._stalled:
                out.error = f"stream stalled: no data for {self.cfg.timeout_s:g} s"
            elif self.stopped is not None:
                out.error = f"interrupted: the replay was stopped ({self.stopped})"
            else:
                raise  # the whole replay is being cancelled
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the watchdog's or the stop's cancel ends here, handled
        except aiohttp.ClientError as exc:
            out.error = f"{type(exc).__name__}: {_one_line(str(exc), 100)}".rstrip(": ")
        except ValueError:  # a chunk that is not JSON
            out.error = "stream error: malformed chunk"
        finally:
            self._streaming.pop(out.index, None)
            if acquired:
                assert self._slots is not None
                self._slots.release()
            if out.error is None:
                self.completed += 1
            else:
                self.failed += 1

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, out: Outcome, deadline: asyncio.Timeout
    ) -> None:
        """Consumes one SSE stream into ``out``. Kept lean: it runs once per chunk."""
        t0 = self.t0
        index = out.index
        last_data = self.last_data
        text_of = self.text_of
        loads = json.loads
        pending = b""
        chunks = 0  # chunks with non-empty text
        first: float | None = None
        last_choice: float | None = None
        done: float | None = None
        usage_tokens: int | None = None
        async for received in resp.content.iter_any():
            now = last_data[index] = perf_counter() - t0
            data = pending + received if pending else received
            lines = data.split(b"\n")
            pending = lines.pop()  # an incomplete last line waits for the next read
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event: lines
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = now
                    continue
                obj = loads(payload)
                choices = obj.get("choices")
                if choices:
                    last_choice = now
                    if text_of(choices[0]):
                        chunks += 1
                        if first is None:
                            if deadline.expired():
                                # The deadline fired while this chunk was on its way: its
                                # cancellation is pending; yielding delivers it, and the
                                # timeout block turns it into TimeoutError (a failed request).
                                await asyncio.sleep(0)
                                out.error = _timeout_message(self.cfg.timeout_s)
                                return
                            first = out.first_token = now
                            # The timeout only covers the first token, as in the simulator.
                            deadline.reschedule(None)
                            task = asyncio.current_task()
                            if task is not None:
                                self._streaming[index] = task
                usage = obj.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens", usage_tokens)
                    out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
                elif not choices:
                    error = _stream_error(obj)
                    if error is not None:
                        out.error = error
                        out.finish = now
                        return
        out.finish = done if done is not None else perf_counter() - t0
        out.output_tokens = usage_tokens if usage_tokens is not None else chunks
        if first is None:
            if last_choice is None:
                out.error = "stream error: no tokens in the stream"
                return
            # Tokens came but none decoded to text (e.g. partial UTF-8 held back): count the
            # last token-carrying chunk, which never flatters TTFT.
            out.first_token = last_choice
        if out.output_tokens <= 0:
            out.error = "stream error: empty output"

    # -- helpers --------------------------------------------------------------------------------
    async def _sleep_or_finish(self, seconds: float) -> bool:
        """Sleeps ``seconds`` or until the replay has finished; True when it has."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), timeout=max(seconds, 0.0))
        return self._finished.is_set()

    def _publish(self) -> None:
        if self.progress is not None:
            self.progress(Progress(len(self.outcomes), self.sent, self.completed, self.failed))

    async def _ticker(self) -> None:
        while True:
            self._publish()
            if await self._sleep_or_finish(_PROGRESS_PERIOD_S):
                return

    async def _watchdog(self) -> None:
        """Fails streams that went silent for ``timeout_s`` after their first token."""
        limit = self.cfg.timeout_s
        period = min(1.0, limit / 4)
        while not await self._sleep_or_finish(period):
            now = perf_counter() - self.t0
            for index, task in list(self._streaming.items()):
                if now - self.last_data[index] > limit:
                    self._stalled.add(index)
                    del self._streaming[index]
                    task.cancel()

    async def _sampler(self, session: aiohttp.ClientSession, interval: float) -> None:
        """Samples ``/admin/stats`` every ``interval`` s on its own session (connection), so that
        a full request pool can never delay a sample."""
        url = self.cfg.endpoint + ADMIN_STATS_PATH
        tick = 0
        while True:
            start = perf_counter() - self.t0
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(url) as resp:
                    doc = await resp.json(content_type=None) if resp.status == 200 else None
                if isinstance(doc, dict):
                    self.samples.append(StatsSample(round(start, 3), doc))
            tick += 1
            if await self._sleep_or_finish(self.t0 + tick * interval - perf_counter()):
                return


def _event_loop_runner() -> tuple[Callable[[Coroutine[Any, Any, None]], None], str]:
    """uvloop when it is installed (cheaper socket handling), else the standard loop."""
    try:
        import uvloop  # noqa: PLC0415 - optional accelerator
    except ImportError:
        return asyncio.run, "asyncio"

    def run(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(coro)

    return run, "uvloop"


def _on_stop_signals(
    loop: asyncio.AbstractEventLoop, stop: Callable[[signal.Signals], None]
) -> list[signal.Signals]:
    """Routes SIGTERM and SIGINT to ``stop`` while the replay runs; returns those installed
    (none off the main thread or where the loop cannot take signal handlers)."""
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop, sig)
        except (NotImplementedError, RuntimeError):
            # RuntimeError: not the main thread; NotImplementedError: a loop without signal
            # support. The signal keeps its default (the replay is cancelled, nothing written).
            continue
        handled.append(sig)
    return handled


def _raise_fd_limit() -> None:
    """Lifts the soft open-files limit to the hard one: each in-flight stream holds a socket,
    and the common soft limit of 1024 would cap a replay at about a thousand streams."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def replay(
    workload: Workload,
    cfg: ReplayConfig,
    progress: Callable[[Progress], None] | None = None,
) -> ReplayResult:
    """Replays ``workload`` against ``cfg.endpoint`` and returns every request's outcome, plus
    ``/admin/stats`` before, during (every ``cfg.stats_interval_s``) and after the replay when the
    endpoint serves it. Blocks until every request has finished or failed, or a stop signal
    (SIGTERM, SIGINT) ends the replay early (``ReplayResult.stopped``)."""
    before = fetch_admin_stats(cfg.endpoint, cfg.api_key) if cfg.stats_interval_s else None
    _raise_fd_limit()
    job = _Replay(workload, cfg, progress)
    run, loop_name = _event_loop_runner()
    started = perf_counter()
    run(job.run())
    wall = perf_counter() - started
    after = fetch_admin_stats(cfg.endpoint, cfg.api_key) if cfg.stats_interval_s else None
    return ReplayResult(
        job.outcomes,
        before,
        job.samples,
        after,
        wall,
        loop_name,
        job.stopped,
        job.stop_signal,
        job.offered,
    )
