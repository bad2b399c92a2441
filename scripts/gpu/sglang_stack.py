"""What the SGLang benchmarks on the H200 share (sglang_overhead.py, sglang_live.py): start
``fluidpd sidecar --engine sglang`` workers, FluidPD's router (and controller), and the plain
SGLang P/D balancer (sglang_minilb.py) on the same SGLang servers; an OpenAI streaming client
that times TTFT and decode; one log file for everything (the machine returns at most 8 files).

Memory on the one GPU: every worker starts at once with ``--mem-fraction F`` and a KV pool cap
(``--sglang-max-total-tokens``). SGLang 0.5.17 sizes its pool as (free memory after its own
weights load) - (free memory before) x (1 - F), then takes the smaller of that and the cap; with
F = 0.8 that stays above the cap whatever the other workers have allocated by then, as long as
the caps fit: n x (15 GB weights + cap x 128 KiB + ~3 GB activations and graphs) < 139 GiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
FLUIDPD = [sys.executable, "-m", "fluidpd.cli.main"]


@dataclass
class Worker:
    wid: str
    role: str
    port: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Stack:
    work: Path
    token: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "FLUIDPD_LOG_DIR": str(self.work),
                    "FLUIDPD_ADMIN_TOKEN": self.token, **(env or {})}  # fmt: skip
        print(f"[stack] start {name}: {' '.join(argv[2:])}", flush=True)
        self.procs[name] = subprocess.Popen(
            argv, env=full_env, stdout=(self.work / f"{name}.out").open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def sidecar(self, w: Worker, common: list[str], extra: list[str]) -> None:
        argv = [*FLUIDPD, "sidecar", "--id", w.wid, "--role", w.role, "--port", str(w.port),
                *common, *extra]  # fmt: skip
        self.start(w.wid, argv, w.env)

    def dead(self) -> list[str]:
        return [f"{n} (rc {p.returncode})" for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, name: str | None = None) -> None:
        names = [name] if name else list(self.procs)
        for n in names:
            p = self.procs.get(n)
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for n in names:
            p = self.procs.get(n)
            if p is None:
                continue
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            if name:
                self.procs.pop(n, None)

    def logs(self, out: Path, lines: int = 60) -> None:
        """Tails of every log of the work dir, in one file."""
        with out.open("w") as f:
            for path in sorted(self.work.glob("*.out")) + sorted(self.work.glob("*.log")):
                text = path.read_text(errors="replace").splitlines()
                f.write(f"===== {path.name} ({len(text)} lines, last {lines})\n")
                f.write("\n".join(text[-lines:]) + "\n")


async def wait_ready(c: httpx.AsyncClient, stack: Stack, urls: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    last = -30.0
    while time.monotonic() - t0 < timeout:
        if stack.dead():
            raise RuntimeError(f"exited while starting: {', '.join(stack.dead())}")
        ok = []
        for u in urls:
            with contextlib.suppress(httpx.HTTPError):
                ok.append((await c.get(u, timeout=5)).status_code == 200)
        if len(ok) == len(urls) and all(ok):
            return time.monotonic() - t0
        if time.monotonic() - last > 20:
            last = time.monotonic()
            print(f"[stack] {time.monotonic() - t0:.0f} s: ready {sum(ok)}/{len(urls)}", flush=True)
        await asyncio.sleep(1.0)
    raise RuntimeError(f"not ready within {timeout:.0f} s: {urls}")


async def sglang_info(c: httpx.AsyncClient, stack: Stack, w: Worker) -> dict[str, Any]:
    r = await c.get(f"{w.url}/v1/internal/sglang", headers=stack.headers, timeout=10)
    r.raise_for_status()
    return dict(r.json())


async def start_minilb(
    c: httpx.AsyncClient, stack: Stack, workers: list[Worker], port: int, model: str
) -> str:
    """The plain SGLang P/D balancer straight onto the workers' SGLang servers."""
    argv = [sys.executable, str(HERE / "sglang_minilb.py"), "--port", str(port), "--model", model]
    for w in workers:
        info = await sglang_info(c, stack, w)
        if w.role == "prefill":
            argv += [
                "--prefill",
                f"{info['url']},{info['bootstrap_host']},{info['bootstrap_port']}",
            ]
        else:
            argv += ["--decode", str(info["url"])]
    stack.start("minilb", argv)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(c, stack, [f"{url}/healthz"], 60)
    return url


async def complete(
    c: httpx.AsyncClient, base: str, model: str, ids: list[int], new: int
) -> dict[str, Any]:
    """One streamed completion (ignore_eos, greedy): TTFT, decode time and tokens."""
    body = {"model": model, "prompt": [ids], "max_tokens": new, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}  # fmt: skip
    t0 = time.perf_counter()
    first: float | None = None
    n = chunks = 0
    err = None
    try:
        async with c.stream("POST", f"{base}/v1/completions", json=body) as r:
            if r.status_code != 200:
                err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    d = json.loads(line[5:])
                    if d.get("error"):
                        err = str(d["error"])[:200]
                    ch = d.get("choices") or []
                    if ch and ch[0].get("text"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter() - t0
                    if d.get("usage"):
                        n = int(d["usage"].get("completion_tokens") or 0)
    except httpx.HTTPError as exc:
        err = repr(exc)[:200]
    wall = time.perf_counter() - t0
    return {"ttft_s": first, "wall_s": wall, "tokens": n or chunks, "error": err}


def term_as_interrupt() -> None:
    """SIGTERM (``timeout``, the machine's limit) unwinds like Ctrl-C, so the ``finally`` that
    stops every SGLang server and writes the JSON runs: a server left behind would hold GPU
    memory for the next command."""

    def handler(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def pct(xs: list[float], q: float) -> float | None:
    """The q-quantile, linear between the two nearest samples (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    k = q * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)
