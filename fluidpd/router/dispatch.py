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
from typing import Any

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
            pair = self.workers.choose()
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
        resp = await self._open_decode(d, job, p)
        prefill = asyncio.ensure_future(self._prefill(p, d, job))
        source = d
        failed_prefill: list[str] = []
        #: The decode stream was closed here (its half could not be told to stop).
        dropped: list[str] = []

        def prefill_ended(task: asyncio.Future[str]) -> None:
            # A prefill half that ends badly before the first token: stop the decode half, whose
            # stream then ends with "cancelled" and the request is re-paired. Unless its hand-off
            # got there first (a prefill worker killed, or its call timed out, after sending
            # the KV): then the decode half goes on, and its first token may be on its way.
            if task.cancelled() or job.tokens:
                return
            status = task.result()
            log.info("request %d prefill half: %s", job.rid, status)
            if status != "done":
                failed_prefill.append(status)
                self._background(stop_decode(f"prefill half {status}"))

        async def stop_decode(reason: str) -> None:
            # An abort that never arrives (the decode worker too slow to answer, or gone)
            # would leave the decode half waiting for a hand-off that is not coming, and the
            # request with it until the first-token timeout: then drop the stream and re-pair
            # (the client has no token yet; closing the stream also ends the half there).
            timeout = self.abort_timeout_s
            if await self._abort_call(source, job.rid, reason, True, tries=2, timeout_s=timeout):
                return
            if not job.tokens:
                log.info("request %d: abort not delivered to %s; re-pairing", job.rid,
                         source.worker)  # fmt: skip
                dropped.append(reason)
                resp.close()

        prefill.add_done_callback(prefill_ended)
        try:
            while True:
                try:
                    if job.tokens:
                        line = await resp.content.readline()
                    else:
                        line = await asyncio.wait_for(
                            resp.content.readline(), max(0.0, deadline - time.time())
                        )
                except aiohttp.ClientError:
                    line = b""  # the decode sidecar went away mid-stream
                except TimeoutError:
                    self._abort(p, job.rid, "first-token timeout")
                    self._abort(source, job.rid, "first-token timeout")
                    raise RequestFailed(
                        504, f"no first token within {self.first_token_timeout_s:g} s"
                    ) from None
                if not line and dropped and not job.tokens:
                    raise _Retry(f"decode {source.worker} not told to stop ({dropped[0]})")
                if not line:
                    if job.tokens:
                        raise RequestFailed(
                            502, f"decode worker {source.worker} was lost mid-stream"
                        )
                    self.workers.suspect(source.worker)
                    self._abort(p, job.rid, "decode half lost")
                    raise _Retry(f"decode {source.worker} stream ended before the first token")
                event = orjson.loads(line)
                kind = event["event"]
                if kind == "token":
                    ids = event["ids"]
                    if ids:
                        job.tokens += len(ids)
                        if not job.first_token_t:
                            job.first_token_t = time.time()
                    yield event
                elif kind == "done":
                    job.finish_reason = event.get("finish_reason") or "length"
                    # Read the stream's end so the connection goes back to the pool.
                    await resp.content.read()
                    return
                elif kind == "migrated":
                    log.info("request %d migrated to %s after %d tokens", job.rid,
                             event["url"], job.tokens)  # fmt: skip
                    resp.release()
                    source = self.workers.workers.get(
                        _worker_of(self.workers, event["url"]), source
                    )
                    resp = await self.session.get(
                        f"{event['url']}/v1/internal/decode/{job.rid}/events", headers=self.headers
                    )
                    if resp.status != 200:
                        raise RequestFailed(502, f"migrated request lost (HTTP {resp.status})")
                elif not job.tokens and kind in ("reroute", "cancelled", "error"):
                    if kind != "cancelled" or not failed_prefill:
                        self._abort(p, job.rid, f"decode half {kind}")
                    why = failed_prefill[0] if failed_prefill else event.get("detail", "")
                    raise _Retry(f"{kind} ({why})")
                else:
                    detail = event.get("detail", "")
                    raise RequestFailed(
                        502, f"decode worker {source.worker}: {kind} {detail}".strip()
                    )
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (a streaming response is cancelled, a non-streaming one by
            # the disconnect watcher): both halves stop now, not when their work is done.
            log.info("request %d cancelled: the client went away", job.rid)
            self._abort(p, job.rid, "client went away")
            self._abort(source, job.rid, "client went away")
            raise
        finally:
            resp.release()
            if not prefill.done():
                prefill.remove_done_callback(prefill_ended)
                prefill.cancel()


def _worker_of(workers: WorkerSet, url: str) -> str:
    for w in workers.workers.values():
        if w.url.rstrip("/") == url.rstrip("/"):
            return w.worker
    return ""
