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
    so a hang shows up as an outcome, not as a stuck drill."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        rps: float,
        prompt_len: tuple[int, int] = (200, 1500),
        max_tokens: tuple[int, int] = (10, 120),
        request_timeout_s: float = 120.0,
        seed: int = 0,
    ) -> None:
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
        # ignore_eos: a real model may sample EOS early, and an answer shorter than asked for
        # must mean something went wrong, not that the model stopped.
        body = {"model": self.model, "prompt": [7] * n, "max_tokens": out.expected,
                "ignore_eos": True}  # fmt: skip
        try:
            async with session.post(
                f"{self.endpoint}/v1/completions",
                data=orjson.dumps(body),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                out.status = resp.status
                data = orjson.loads(await resp.read())
            if out.status == 200:
                out.tokens = int(data["usage"]["completion_tokens"])
            else:
                out.error = str(data.get("error", {}).get("message", "")) or f"HTTP {out.status}"
        except TimeoutError:
            out.error = "client timeout"
        except (aiohttp.ClientError, ValueError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        out.end = time.time()

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
