"""The router's Dispatcher on its failure paths, in process: scripted prefill and decode sidecar
stand-ins over real HTTP on loopback, so each path is reached on purpose.

Paths: a decode half turned away (409) is re-paired; a decode stream that ends before the first
token (the peer died mid-hand-off) suspects that worker, aborts the prefill half and re-pairs; a
decode worker lost after the first token fails the request (502, nothing is re-sent twice); a
prefill half that fails aborts its decode half, which ends "cancelled", and re-pairs; no first
token in time aborts both halves (504); no pair at all answers 503; a migrated request is
followed to its new decode worker. And the cuts the chaos drill's SIGKILLs make: a stream cut
inside an event line, or a migration to a worker that is gone, is the worker lost mid-stream
(502); a stream cut after its ``done`` event is a complete answer; an event the router cannot
read ends the request with a readable 502, never a cut connection.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from fluidpd.core.pairing import RoundRobinPairing
from fluidpd.core.types import Role, RoleState
from fluidpd.router.dispatch import Dispatcher, Job, RequestFailed
from fluidpd.router.workers import WorkerSet

Script = Callable[["Fake", web.Request, web.StreamResponse], Awaitable[None]]


def _line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event) + b"\n"


TOKEN = {"event": "token", "ids": [5], "text": "x"}
DONE = {"event": "done", "finish_reason": "length"}


@dataclass
class Fake:
    """One sidecar: ``decode`` scripts its decode stream (or returns a status), ``prefill`` is
    the prefill half's answer."""

    name: str
    role: Role
    decode: Script | int | None = None
    #: One answer per prefill half, the last one repeated.
    prefill: list[dict[str, Any] | int] = field(default_factory=lambda: [{"status": "done"}])
    aborts: list[dict[str, Any]] = field(default_factory=list)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)
    url: str = ""
    #: Seconds before it answers an abort (a worker too loaded to answer in time).
    abort_delay: float = 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(request.path)
        if request.path == "/v1/internal/abort":
            self.aborts.append(orjson.loads(await request.read()))
            await asyncio.sleep(self.abort_delay)
            self.aborted.set()
            return web.Response(text="{}")
        if request.path == "/v1/internal/prefill":
            answer = self.prefill.pop(0) if len(self.prefill) > 1 else self.prefill[0]
            if isinstance(answer, int):
                return web.Response(status=answer)
            return web.Response(body=orjson.dumps(answer))
        if isinstance(self.decode, int):
            return web.Response(status=self.decode, text="not taking work")
        resp = web.StreamResponse()
        await resp.prepare(request)
        assert self.decode is not None
        await self.decode(self, request, resp)
        return resp


async def tokens_then_done(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    for event in (TOKEN, TOKEN, DONE):
        await resp.write(_line(event))


async def end_before_first_token(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    pass  # the stream closes empty: the decode worker died before the hand-off finished


async def die_after_a_token(fake: Fake, request: web.Request, resp: web.StreamResponse) -> None:
    await resp.write(_line(TOKEN))
    assert request.transport is not None
    request.transport.close()  # the process went away mid-stream


async def die_mid_line(fake: Fake, request: web.Request, resp: web.StreamResponse) -> None:
    await resp.write(_line(TOKEN))
    await resp.write(_line(TOKEN)[:9])  # the process died while its next event was on the wire
    assert request.transport is not None
    request.transport.close()  # a cut inside an event line is the same loss


async def cancelled_once_aborted(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    await fake.aborted.wait()  # as a decode sidecar does when told the prefill half failed
    await resp.write(_line({"event": "cancelled", "detail": "aborted"}))


async def never_a_token(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    await fake.aborted.wait()  # holds the stream open until the router gives up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Play = Callable[[Dispatcher, dict[str, Fake]], Awaitable[None]]


def run(fakes: list[Fake], play: Play, first_token_timeout_s: float = 30.0) -> Dispatcher:
    async def main() -> Dispatcher:
        runners = []
        for f in fakes:
            # The events are made inside the loop that awaits them.
            f.aborted = asyncio.Event()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", f.handle)
            runner = web.AppRunner(app)
            await runner.setup()
            port = _free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            f.url = f"http://127.0.0.1:{port}"
            runners.append(runner)
        workers = WorkerSet(RoundRobinPairing())
        workers.set({f.name: f.url for f in fakes})
        for f in fakes:  # what a poll would have seen
            info = workers.workers[f.name]
            info.role, info.state, info.healthy = f.role, RoleState.ACTIVE, True
        try:
            async with aiohttp.ClientSession() as session:
                dispatcher = Dispatcher(workers, session, "tok", first_token_timeout_s)
                await play(dispatcher, {f.name: f for f in fakes})
                await dispatcher.settle(30.0)  # the fire-and-forget aborts land
                return dispatcher
        finally:
            for runner in runners:
                await runner.cleanup()

    return asyncio.run(main())


async def collect(dispatcher: Dispatcher, job: Job) -> list[dict[str, Any]]:
    return [event async for event in dispatcher.generate(job)]


def _job() -> Job:
    return Job(prompt_ids=[1, 2, 3], sampling={"max_new_tokens": 4}, arrival=time.time())


def test_a_decode_half_turned_away_is_re_paired() -> None:
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=409),
             Fake("d1", Role.DECODE, decode=tokens_then_done)]  # fmt: skip
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        events = await collect(dispatcher, job)
        assert [e["event"] for e in events] == ["token", "token"]

    dispatcher = run(fakes, play)
    assert dispatcher.retries == 1 and job.attempts == 2 and job.finish_reason == "length"
    assert fakes[1].calls == ["/v1/internal/decode"]  # never sent the prefill half's pair
    assert job.tokens == 2


def test_a_decode_peer_dying_mid_hand_off_is_suspected_and_the_request_re_paired() -> None:
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=end_before_first_token),
             Fake("d1", Role.DECODE, decode=tokens_then_done)]  # fmt: skip
    job = _job()
    seen: dict[str, float] = {}

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        await collect(dispatcher, job)
        seen["suspect_until"] = dispatcher.workers.workers["d0"].suspect_until

    dispatcher = run(fakes, play)
    assert dispatcher.retries == 1 and job.finish_reason == "length"
    assert seen["suspect_until"] > job.arrival  # not chosen again until a poll clears it
    first_rid = fakes[0].aborts[0]["rid"]
    assert fakes[0].aborts == [{"rid": first_rid, "reason": "decode half lost"}]
    assert first_rid != job.rid  # the second attempt is a new request id


@pytest.mark.parametrize("script", [die_after_a_token, die_mid_line])
def test_a_decode_worker_lost_after_the_first_token_fails_the_request(script: Script) -> None:
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=script)]
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        got: list[dict[str, Any]] = []
        with pytest.raises(RequestFailed) as failed:
            async for event in dispatcher.generate(job):
                got.append(event)
        assert failed.value.status == 502 and "lost mid-stream" in failed.value.message
        assert len(got) == 1  # the token already sent stays sent; nothing is replayed

    dispatcher = run(fakes, play)
    assert dispatcher.retries == 0


def test_a_failed_prefill_half_cancels_its_decode_half_and_re_pairs() -> None:
    fakes = [Fake("p0", Role.PREFILL, prefill=[{"status": "reroute"}, {"status": "done"}]),
             Fake("d0", Role.DECODE, decode=cancelled_once_aborted),
             Fake("d1", Role.DECODE, decode=tokens_then_done)]  # fmt: skip
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        await collect(dispatcher, job)

    dispatcher = run(fakes, play)
    assert dispatcher.retries == 1 and job.finish_reason == "length"
    assert [a["reason"] for a in fakes[1].aborts] == ["prefill half reroute"]
    # Its own half already ended: nothing to abort there; the decode half was told why.
    assert fakes[0].aborts == []


def test_no_first_token_in_time_aborts_both_halves() -> None:
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=never_a_token)]
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        with pytest.raises(RequestFailed) as failed:
            await collect(dispatcher, job)
        assert failed.value.status == 504

    run(fakes, play, first_token_timeout_s=0.5)
    assert [a["reason"] for a in fakes[0].aborts] == ["first-token timeout"]
    assert "first-token timeout" in [a["reason"] for a in fakes[1].aborts]


def test_no_pair_at_all_answers_503() -> None:
    fakes = [Fake("p0", Role.PREFILL)]  # no decode worker
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        with pytest.raises(RequestFailed) as failed:
            await collect(dispatcher, job)
        assert failed.value.status == 503 and "no active" in failed.value.message

    run(fakes, play, first_token_timeout_s=0.3)
    assert fakes[0].calls == []


def test_a_migrated_request_is_followed_to_its_new_decode_worker() -> None:
    target = Fake("d1", Role.DECODE, decode=tokens_then_done)

    async def migrate(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(_line(TOKEN))
        await resp.write(_line({"event": "migrated", "url": target.url}))

    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=migrate), target]
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        dispatcher.workers.workers["d1"].healthy = False  # not a pairing choice, only a target
        events = await collect(dispatcher, job)
        assert len(events) == 3  # one before the move, two after

    run(fakes, play)
    assert target.calls == [f"/v1/internal/decode/{job.rid}/events"]
    assert job.finish_reason == "length"


async def started_before_the_abort(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    # The hand-off got here before the router heard the prefill half fail: a decode sidecar
    # cancels such a half only on an unconditional abort.
    await fake.aborted.wait()
    if fake.aborts[-1].get("unless_started"):
        for event in (TOKEN, TOKEN, DONE):
            await resp.write(_line(event))
    else:
        await resp.write(_line({"event": "cancelled", "detail": fake.aborts[-1]["reason"]}))


def test_a_prefill_half_failing_after_its_hand_off_does_not_cancel_the_decode_half() -> None:
    # A prefill worker killed (or its hand-off call timed out) once its KV had been sent.
    failed = {"status": "cancelled", "detail": "hand-off failed: TimeoutError"}
    fakes = [Fake("p0", Role.PREFILL, prefill=[failed]),
             Fake("d0", Role.DECODE, decode=started_before_the_abort)]  # fmt: skip
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        events = await collect(dispatcher, job)
        assert [e["event"] for e in events] == ["token", "token"]

    dispatcher = run(fakes, play)
    assert fakes[1].aborts == [
        {"rid": job.rid, "reason": "prefill half cancelled", "unless_started": True}
    ]
    assert dispatcher.retries == 0 and job.attempts == 1 and job.finish_reason == "length"


async def no_token_until_closed(fake: Fake, request: web.Request, _: web.StreamResponse) -> None:
    # A decode half waiting for a hand-off that is not coming; it ends when the router drops
    # the stream (as a decode sidecar's does).
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)


def test_an_abort_the_decode_half_never_answers_drops_it_and_re_pairs() -> None:
    # Found by the chaos drill: a prefill worker killed before its hand-off, and the abort to a
    # decode worker too loaded to answer within its timeout: the request waited for the
    # first-token timeout (504) instead of being re-paired.
    fakes = [Fake("p0", Role.PREFILL, prefill=[{"status": "cancelled"}, {"status": "done"}]),
             Fake("d0", Role.DECODE, decode=no_token_until_closed, abort_delay=5.0),
             Fake("d1", Role.DECODE, decode=tokens_then_done)]  # fmt: skip
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        dispatcher.abort_timeout_s = 0.2
        events = await collect(dispatcher, job)
        assert [e["event"] for e in events] == ["token", "token"]

    dispatcher = run(fakes, play, first_token_timeout_s=20.0)
    assert dispatcher.retries == 1 and job.attempts == 2 and job.finish_reason == "length"
    assert [a["unless_started"] for a in fakes[1].aborts] == [True, True]  # asked twice


def test_a_worker_that_turns_requests_away_is_skipped_until_polled_again() -> None:
    # Found by the chaos drill: the only decode worker the router thought Active was draining
    # (a switch since its last poll) and answered 409; every re-pairing chose it again, and the
    # request spent its 6 attempts in 40 ms (503) before the next poll.
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=409),
             Fake("d1", Role.DECODE, decode=tokens_then_done)]  # fmt: skip
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        d1 = dispatcher.workers.workers["d1"]
        d1.healthy = False  # restarting: the next poll brings it back

        async def poll_brings_d1_back() -> None:
            await asyncio.sleep(0.5)
            d1.healthy = True

        back = asyncio.ensure_future(poll_brings_d1_back())
        events = await collect(dispatcher, job)
        await back
        assert [e["event"] for e in events] == ["token", "token"]

    dispatcher = run(fakes, play)
    assert fakes[1].calls == ["/v1/internal/decode"]  # turned away once, then skipped
    assert dispatcher.retries == 1 and job.finish_reason == "length"


async def die_after_done(fake: Fake, request: web.Request, resp: web.StreamResponse) -> None:
    for event in (TOKEN, TOKEN, DONE):
        await resp.write(_line(event))
    await asyncio.sleep(0.05)  # the router has read ``done`` and reads the stream's end
    assert request.transport is not None
    request.transport.close()  # killed before the stream's last chunk


def test_a_decode_worker_lost_after_its_done_event_completes_the_request() -> None:
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=die_after_done)]
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        events = await collect(dispatcher, job)
        assert [e["event"] for e in events] == ["token", "token"]

    dispatcher = run(fakes, play)
    assert dispatcher.retries == 0 and job.finish_reason == "length" and job.tokens == 2


def _fails_with_502(decode: Script, words: str) -> Dispatcher:
    """One pair whose decode half runs ``decode``: the request fails with a 502 whose message
    holds ``words``."""
    fakes = [Fake("p0", Role.PREFILL), Fake("d0", Role.DECODE, decode=decode)]
    job = _job()

    async def play(dispatcher: Dispatcher, f: dict[str, Fake]) -> None:
        with pytest.raises(RequestFailed) as failed:
            await collect(dispatcher, job)
        assert failed.value.status == 502 and words in failed.value.message

    return run(fakes, play)


def test_a_migration_to_a_worker_that_is_gone_fails_the_request_as_lost() -> None:
    gone = f"http://127.0.0.1:{_free_port()}"  # nothing listens there

    async def migrate(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(_line(TOKEN))
        await resp.write(_line({"event": "migrated", "url": gone}))

    _fails_with_502(migrate, "lost mid-stream")


async def an_event_without_ids(fake: Fake, _: web.Request, resp: web.StreamResponse) -> None:
    await resp.write(_line({"event": "token", "text": "x"}))  # a sidecar of another version


def test_an_event_the_router_cannot_read_fails_the_request_with_a_readable_error() -> None:
    dispatcher = _fails_with_502(an_event_without_ids, "KeyError")
    assert dispatcher.retries == 0
