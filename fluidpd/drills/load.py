"""An open-loop load generator for drills (not the benchmark client: see ``fluidpd replay``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass(slots=True)
class Outcome:
    start: float
    end: float = 0.0
    status: int = 0
    tokens: int = 0
    expected: int = 0
    error: str = ""
    #: Streamed (SSE) rather than one JSON answer.
    stream: bool = False
    #: A streamed answer's first text chunk (0: none arrived).
    first_token: float = 0.0
    #: Attempts that got no answer (refused or cut connection) and were sent again:
    #: (time the attempt ended, its error).
    retries: list[tuple[float, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.tokens == self.expected and not self.error


@dataclass(slots=True)
class LoadReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self, hang_s: float) -> dict[str, Any]:
        done = [o for o in self.outcomes if o.end]
        errors = Counter(o.error or f"HTTP {o.status}" for o in done if not o.ok)
        return {
            "sent": len(self.outcomes),
            "completed": sum(1 for o in done if o.ok),
            "failed_clearly": sum(1 for o in done if not o.ok),
            "hung": sum(1 for o in self.outcomes if not o.end or o.end - o.start > hang_s),
            "errors": dict(errors),
        }


class OpenLoopLoad:
    """Sends completions at a Poisson rate; every request is bounded by ``request_timeout_s``
    so a hang shows up as an outcome, not as a stuck drill.

    ``stream_share``: the share of requests streamed (SSE). ``retry_unanswered_s``: like the
    OpenAI SDK's retries, a request whose connection was refused or cut before any answer (a
    non-streamed one: before its JSON; a streamed one: before its first token) is sent again,
    for up to this long after it started; every retry is recorded (0: never retry)."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        rps: float,
        prompt_len: tuple[int, int] = (200, 1500),
        max_tokens: tuple[int, int] = (10, 120),
        request_timeout_s: float = 120.0,
        seed: int = 0,
        stream_share: float = 0.0,
        retry_unanswered_s: float = 0.0,
    ) -> None:
        self.stream_share = stream_share
        self.retry_s = retry_unanswered_s
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.rps = rps
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.timeout = request_timeout_s
        self.rng = random.Random(seed)
        self.report = LoadReport()

    async def _one(self, session: aiohttp.ClientSession, out: Outcome) -> None:
        n = self.rng.randint(*self.prompt_len)
        out.expected = self.rng.randint(*self.max_tokens)
        # Drawn only when asked for: the other drills' request sequences stay as they were.
        out.stream = self.stream_share > 0 and self.rng.random() < self.stream_share
        # ignore_eos: a real model may sample EOS early, and an answer shorter than asked for
        # must mean something went wrong, not that the model stopped.
        body: dict[str, object] = {"model": self.model, "prompt": [7] * n,
                                   "max_tokens": out.expected, "ignore_eos": True}  # fmt: skip
        if out.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        deadline = out.start + self.timeout
        while True:
            answered = False
            try:
                async with session.post(
                    f"{self.endpoint}/v1/completions",
                    data=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=max(0.1, deadline - time.time())),
                ) as resp:
                    out.status = resp.status
                    if out.stream and resp.status == 200:
                        await self._read_stream(resp, out)
                    else:
                        data = orjson.loads(await resp.read())
                        answered = True
                        if out.status == 200:
                            out.tokens = int(data["usage"]["completion_tokens"])
                        else:
                            message = str(data.get("error", {}).get("message", ""))
                            out.error = message or f"HTTP {out.status}"
            except TimeoutError:
                out.error = "client timeout"
            except (aiohttp.ClientError, ValueError) as exc:
                out.error = f"{type(exc).__name__}: {exc}"
                unanswered = not answered and not out.first_token and not out.tokens
                if unanswered and isinstance(exc, aiohttp.ClientError) and self._may_retry(out):
                    out.retries.append((time.time(), out.error))
                    out.status, out.error = 0, ""
                    await asyncio.sleep(min(2.0, 0.25 * 2 ** len(out.retries)))
                    continue
            break
        out.end = time.time()

    def _may_retry(self, out: Outcome) -> bool:
        return time.time() - out.start < min(self.retry_s, self.timeout - 5.0)

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, out: Outcome) -> None:
        """Reads an SSE completion stream; an error event ends it with that error."""
        done = False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                break
            data = orjson.loads(payload)
            if "error" in data:
                out.error = str(data["error"].get("message", "")) or "stream error"
            elif data.get("usage"):
                out.tokens = int(data["usage"]["completion_tokens"])
            elif data.get("choices") and not out.first_token:
                out.first_token = time.time()
        if not done and not out.error:
            raise aiohttp.ClientPayloadError("the stream ended without [DONE]")

    async def run(self, duration_s: float, stop: asyncio.Event | None = None) -> LoadReport:
        tasks: list[asyncio.Task[None]] = []
        # Idle connections are dropped before the server's keep-alive (uvicorn: 5 s) closes them,
        # or a request sent on one the server is closing fails with "Server disconnected".
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
        async with aiohttp.ClientSession(connector=connector) as session:
            t_end = time.time() + duration_s
            while time.time() < t_end and not (stop and stop.is_set()):
                out = Outcome(time.time())
                self.report.outcomes.append(out)
                tasks.append(asyncio.create_task(self._one(session, out)))
                await asyncio.sleep(self.rng.expovariate(self.rps))
            if tasks:
                await asyncio.wait(tasks)
        return self.report
