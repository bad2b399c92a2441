"""One request through a prefill/decode pair: send both halves, relay the decode stream,
re-pair when a half is turned away or rerouted, and give up cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

import aiohttp
import orjson
from pydantic import ValidationError

from fluidpd.api.internal import (
    MAX_RID,
    Abort,
    DecodeHalf,
    PrefillHalf,
    PrefillOutcome,
    RequestHalf,
)
from fluidpd.api.sampling import FinishReason
from fluidpd.router.workers import WorkerInfo, WorkerSet

log = logging.getLogger("fluidpd.router.dispatch")

_JSON = {"content-type": "application/json"}


class RequestFailed(Exception):
    """The request cannot be completed; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Retry(Exception):
    """This pair could not serve the request before it started; pair it again."""


@dataclass(slots=True)
class Job:
    prompt_ids: list[int]
    #: ``SamplingParams.model_dump()``: sent with both halves.
    sampling: dict[str, Any]
    arrival: float
    #: The id the client sees (``cmpl-...``). Logged with ``rid`` when the request is admitted:
    #: the workers' logs know only ``rid``, so this line is where a client's report of a lost
    #: request is traced from.
    public_id: str = ""
    rid: int = 0
    tokens: int = 0
    attempts: int = 0
    first_token_t: float = 0.0
    finish_reason: FinishReason | None = None
    #: Set once per attempt: the fields both halves share (validated then, once).
    _half: RequestHalf | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


class Dispatcher:
    def __init__(
        self,
        workers: WorkerSet,
        session: aiohttp.ClientSession,
        token: str | None = None,
        first_token_timeout_s: float = 60.0,
        max_attempts: int = 6,
    ) -> None:
        self.workers = workers
        self.session = session
        self.headers = {**_JSON, **({"Authorization": f"Bearer {token}"} if token else {})}
        self.first_token_timeout_s = first_token_timeout_s
        self.max_attempts = max_attempts
        self.retries = 0
        self._aborts: set[asyncio.Future[Any]] = set()
        #: How long to wait for a decode half's answer to an abort that must land (x2 tries).
        self.abort_timeout_s = 5.0

    async def generate(self, job: Job) -> AsyncIterator[dict[str, Any]]:
        """Yields the decode stream's ``token`` events (``fluidpd.api.internal.DecodeEvent``
        as parsed JSON: ids, text, logprobs) until the request is done; ``job.finish_reason``
        is then set."""
        deadline = job.arrival + self.first_token_timeout_s
        while True:
            job.attempts += 1
            if job.attempts > self.max_attempts:
                raise RequestFailed(
                    503, f"no worker pair could take the request in {self.max_attempts} attempts"
                )
            pair = self.workers.choose(job.prompt_len)
            if pair is None:
                if time.time() >= deadline:
                    raise RequestFailed(503, "no active prefill and decode workers")
                await asyncio.sleep(0.2)  # a switch or a restart may be under way
                job.attempts -= 1
                continue
            job.rid = random.randint(0, MAX_RID)
            job._half = RequestHalf(
                rid=job.rid, prompt_ids=job.prompt_ids, sampling=job.sampling, arrival=job.arrival
            )
            log.info(
                "request %d admitted (%s): %d prompt tokens, prefill %s, decode %s (attempt %d)",
                job.rid, job.public_id or "-", job.prompt_len, pair[0].worker, pair[1].worker,
                job.attempts,
            )  # fmt: skip
            try:
                async for event in self._attempt(job, *pair, deadline):
                    yield event
                log.info(
                    "request %d finished: %s, %d tokens", job.rid, job.finish_reason, job.tokens
                )
                return
            except RequestFailed as exc:
                log.warning("request %d failed: HTTP %d: %s", job.rid, exc.status, exc.message)
                raise
            except _Retry as why:
                self.retries += 1
                log.info("request %d re-paired: %s", job.rid, why)
                continue
            except Exception as exc:
                # Anything else (an event this router cannot read, an error no path above
                # expects) still ends the request with an answer the client can read: raised
                # on, it would cut a stream mid-chunk or answer a bare 500.
                log.exception("request %d failed unexpectedly", job.rid)
                raise RequestFailed(502, f"internal error: {type(exc).__name__}: {exc}") from exc

    async def _post(self, url: str, body: RequestHalf) -> aiohttp.ClientResponse:
        return await self.session.post(url, data=body.model_dump_json(), headers=self.headers)

    @staticmethod
    def _shared(job: Job) -> dict[str, Any]:
        assert job._half is not None
        # Validated when the attempt began; each half adds only its peer's id and address.
        return dict(job._half)

    async def _abort_call(
        self, worker: WorkerInfo, rid: int, reason: str, unless_started: bool = False,
        tries: int = 1, timeout_s: float = 2.0,
    ) -> bool:  # fmt: skip
        """Tells ``worker`` to abort ``rid``; True once it answered (whatever it did)."""
        # Only what is set goes on the wire: a plain abort reads as it always did.
        fields: dict[str, Any] = {"rid": rid, "reason": reason}
        if unless_started:
            fields["unless_started"] = True
        body = Abort(**fields).model_dump_json(exclude_unset=True)
        for _ in range(tries):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.post(
                    f"{worker.url}/v1/internal/abort",
                    data=body,
                    headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    if resp.status < 500:
                        return True
        return False

    def _background(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(coro)
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def settle(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for the aborts still on their way: on shutdown, so that
        a worker is told to drop what it would otherwise hold until its own timeout."""
        if self._aborts:
            await asyncio.wait(set(self._aborts), timeout=timeout_s)

    def _abort(self, worker: WorkerInfo, rid: int, reason: str) -> None:
        self._background(self._abort_call(worker, rid, reason))

    async def _open_decode(self, d: WorkerInfo, job: Job, p: WorkerInfo) -> aiohttp.ClientResponse:
        body = DecodeHalf.model_construct(
            **self._shared(job), prefill_worker=p.worker, prefill_url=p.url
        )
        try:
            resp = await self._post(f"{d.url}/v1/internal/decode", body)
        except aiohttp.ClientError as exc:
            self.workers.suspect(d.worker)
            raise _Retry(f"decode {d.worker} unreachable: {exc}") from None
        if resp.status == 409:
            resp.release()
            self.workers.turned_away(d.worker)
            raise _Retry(f"decode {d.worker} not taking work")
        if resp.status != 200:
            text = await resp.text()
            resp.release()
            raise RequestFailed(resp.status if resp.status < 500 else 502, text[:300])
        return resp

    async def _prefill(self, p: WorkerInfo, d: WorkerInfo, job: Job) -> str:
        """The prefill half's outcome status ("done", "reroute", "cancelled", or an error)."""
        body = PrefillHalf.model_construct(
            **self._shared(job), decode_worker=d.worker, decode_url=d.url
        )
        try:
            async with await self._post(f"{p.url}/v1/internal/prefill", body) as resp:
                if resp.status == 409:
                    self.workers.turned_away(p.worker)
                    return "busy"
                if resp.status != 200:
                    return f"error: HTTP {resp.status}"
                return PrefillOutcome.model_validate_json(await resp.read()).status
        except aiohttp.ClientError:
            self.workers.suspect(p.worker)
            return "unreachable"
        except ValidationError:
            return "error"

    async def _attempt(
        self, job: Job, p: WorkerInfo, d: WorkerInfo, deadline: float
    ) -> AsyncIterator[dict[str, Any]]:
        attempt = _Attempt(self, job, p, d, deadline, await self._open_decode(d, job, p))
        try:
            while not attempt.finished:
                line = await attempt.next_line()
                if not line:
                    attempt.stream_ended()
                relay = await attempt.on_event(orjson.loads(line))
                if relay is not None:
                    yield relay
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (a streaming response is cancelled, a non-streaming one by
            # the disconnect watcher): both halves stop now, not when their work is done.
            log.info("request %d cancelled: the client went away", job.rid)
            attempt.abort_both("client went away")
            raise
        finally:
            attempt.close()


class _Attempt:
    """One pairing attempt while its decode stream is read: the prefill call runs alongside,
    and the stream may move to another decode worker (a migration)."""

    def __init__(
        self, dispatcher: Dispatcher, job: Job, p: WorkerInfo, d: WorkerInfo, deadline: float,
        resp: aiohttp.ClientResponse,
    ) -> None:  # fmt: skip
        self.dispatcher = dispatcher
        self.job = job
        #: The prefill worker.
        self.p = p
        #: The decode worker the stream comes from: ``d`` until the request migrates.
        self.source = d
        #: The first-token deadline.
        self.deadline = deadline
        self.resp = resp
        #: The status of a prefill half that ended badly before the first token.
        self.failed_prefill: list[str] = []
        #: The decode stream was closed here (its half could not be told to stop).
        self.dropped: list[str] = []
        #: The decode stream said ``done``: the request is complete.
        self.finished = False
        self.prefill = asyncio.ensure_future(dispatcher._prefill(p, d, job))
        self.prefill.add_done_callback(self.prefill_ended)

    def abort_both(self, reason: str) -> None:
        """Tells both halves, the prefill one first, to stop (not waiting for their answer)."""
        self.dispatcher._abort(self.p, self.job.rid, reason)
        self.dispatcher._abort(self.source, self.job.rid, reason)

    def prefill_ended(self, task: asyncio.Future[str]) -> None:
        # A prefill half that ends badly before the first token: stop the decode half, whose
        # stream then ends with "cancelled" and the request is re-paired. Unless its hand-off
        # got there first (a prefill worker killed, or its call timed out, after sending
        # the KV): then the decode half goes on, and its first token may be on its way.
        if task.cancelled() or self.job.tokens:
            return
        status = task.result()
        log.info("request %d prefill half: %s", self.job.rid, status)
        if status != "done":
            self.failed_prefill.append(status)
            self.dispatcher._background(self.stop_decode(f"prefill half {status}"))

    async def stop_decode(self, reason: str) -> None:
        # An abort that never arrives (the decode worker too slow to answer, or gone)
        # would leave the decode half waiting for a hand-off that is not coming, and the
        # request with it until the first-token timeout: then drop the stream and re-pair
        # (the client has no token yet; closing the stream also ends the half there).
        dispatcher, job = self.dispatcher, self.job
        timeout = dispatcher.abort_timeout_s
        if await dispatcher._abort_call(
            self.source, job.rid, reason, True, tries=2, timeout_s=timeout
        ):
            return
        if not job.tokens:
            log.info("request %d: abort not delivered to %s; re-pairing", job.rid,
                     self.source.worker)  # fmt: skip
            self.dropped.append(reason)
            self.resp.close()

    async def next_line(self) -> bytes:
        """The decode stream's next line, within the first-token deadline until a token came;
        empty once the stream ended."""
        try:
            if self.job.tokens:
                return await self.resp.content.readline()
            return await asyncio.wait_for(
                self.resp.content.readline(), max(0.0, self.deadline - time.time())
            )
        except aiohttp.ClientError:
            return b""  # the decode sidecar went away mid-stream
        except TimeoutError:
            self.abort_both("first-token timeout")
            raise RequestFailed(
                504, f"no first token within {self.dispatcher.first_token_timeout_s:g} s"
            ) from None

    def stream_ended(self) -> NoReturn:
        """The decode stream ended without ``done``."""
        job, worker = self.job, self.source.worker
        if job.tokens:
            raise RequestFailed(502, f"decode worker {worker} was lost mid-stream")
        if self.dropped:
            raise _Retry(f"decode {worker} not told to stop ({self.dropped[0]})")
        self.dispatcher.workers.suspect(worker)
        self.dispatcher._abort(self.p, job.rid, "decode half lost")
        raise _Retry(f"decode {worker} stream ended before the first token")

    async def on_event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Acts on one decode event; returns it when it goes on to the client."""
        kind = event["event"]
        if kind == "token":
            self.count_tokens(event["ids"])
            return event
        if kind == "done":
            self.job.finish_reason = event.get("finish_reason") or "length"
            self.finished = True
            # Read the stream's end so the connection goes back to the pool. The request is
            # complete whatever happens to the stream now: a worker killed between ``done`` and
            # its last chunk cut the client's stream of a finished answer (chaos drill).
            try:
                await self.resp.content.read()
            except aiohttp.ClientError:
                self.resp.close()
        elif kind == "migrated":
            await self.follow_migration(event["url"])
        elif not self.job.tokens and kind in ("reroute", "cancelled", "error"):
            self.turned_back(kind, event)
        else:
            detail = event.get("detail", "")
            raise RequestFailed(502, f"decode worker {self.source.worker}: {kind} {detail}".strip())
        return None

    def count_tokens(self, ids: list[int]) -> None:
        if ids:
            self.job.tokens += len(ids)
            if not self.job.first_token_t:
                self.job.first_token_t = time.time()

    async def follow_migration(self, url: str) -> None:
        """Re-opens the stream on the decode worker at ``url``, which has the request now."""
        job, dispatcher = self.job, self.dispatcher
        log.info("request %d migrated to %s after %d tokens", job.rid, url, job.tokens)
        self.resp.release()
        self.source = dispatcher.workers.workers.get(
            _worker_of(dispatcher.workers, url), self.source
        )
        try:
            self.resp = await dispatcher.session.get(
                f"{url}/v1/internal/decode/{job.rid}/events", headers=dispatcher.headers
            )
        except aiohttp.ClientError:
            # The worker it moved to is gone (killed, or unreachable): as its stream ending.
            self.stream_ended()
        if self.resp.status != 200:
            raise RequestFailed(502, f"migrated request lost (HTTP {self.resp.status})")

    def turned_back(self, kind: str, event: dict[str, Any]) -> NoReturn:
        """The decode half ended (``kind``: reroute, cancelled, error) before the first token:
        the request is paired again."""
        # A decode half cancelled because its prefill half failed (stopped by ``stop_decode``)
        # has no prefill half left to stop; after any other ending it may still be running.
        if kind != "cancelled" or not self.failed_prefill:
            self.dispatcher._abort(self.p, self.job.rid, f"decode half {kind}")
        why = self.failed_prefill[0] if self.failed_prefill else event.get("detail", "")
        raise _Retry(f"{kind} ({why})")

    def close(self) -> None:
        """The attempt is over, however it ended: the stream goes back, the prefill call (if
        still under way) is given up without its outcome being acted on."""
        self.resp.release()
        if not self.prefill.done():
            self.prefill.remove_done_callback(self.prefill_ended)
            self.prefill.cancel()


def _worker_of(workers: WorkerSet, url: str) -> str:
    for w in workers.workers.values():
        if w.url.rstrip("/") == url.rstrip("/"):
            return w.worker
    return ""
