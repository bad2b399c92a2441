"""FluidRole on real SGLang 0.5.17 servers (CPU): in-place P->D and D->P switches of running
SGLang workers under load, through ``fluidpd up --engine sglang``.

A 2P1D deployment (three SGLang servers with the tiny random-weight Llama of
``test_sglang_cpu``; KV over SGLang's own Mooncake TCP transfer). While requests stream, the
prefill w1 becomes a decode worker and then the decode w2 becomes a prefill worker (so each
role always has a worker). Checked: every request completes with the same greedy text as
before any switch (which ``test_sglang_cpu`` proves equal to plain SGLang), the SGLang
process of each switched worker is the same one (pid, no restart, weights loaded once), and
the switch is reported by ``/role``, ``/pressure`` and ``/metrics`` as for the other engines.
Slow: three SGLang servers start on two cores (minutes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from tests.sglang.test_sglang_cpu import DTYPE, MAX_TOKENS, START_S, _free_ports

TOKEN = "fluidrole-test"
N_PROMPTS = 6
NEW_TOKENS = 24


@dataclass
class Up:
    router: str
    workers: dict[str, str]
    run_dir: Path
    proc: subprocess.Popen[bytes]

    def get(self, wid: str, path: str) -> httpx.Response:
        return httpx.get(f"{self.workers[wid]}{path}", headers=_auth(), timeout=10)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def up(
    sglang_python: str, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Up]:
    run_dir = tmp_path_factory.mktemp("fluidrole-up")
    (port,) = _free_ports(1)
    base = _free_ports(1)[0]
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "up", "--engine", "sglang", "--pd", "2P1D",
        "--policy", "static", "--device", "cpu", "--model-dir", str(tiny_llama_dir),
        "--sglang-python", sglang_python, "--sglang-max-total-tokens", str(MAX_TOKENS),
        "--sglang-start-timeout", str(START_S), "--port", str(port), "--base-port", str(base),
        "--run-dir", str(run_dir), "--admin-token", TOKEN, "--first-token-timeout", "300",
        "--sglang-dtype", DTYPE,
    ]  # fmt: skip
    env = {**os.environ, "FLUIDPD_LOG_DIR": str(run_dir)}
    out = (run_dir / "up.out").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir)
    try:
        t0 = time.monotonic()
        while not (run_dir / "endpoint").exists():
            assert proc.poll() is None, (run_dir / "up.out").read_text()[-3000:]
            assert time.monotonic() - t0 < START_S + 120, "fluidpd up did not come up"
            time.sleep(1.0)
        workers = {f"w{i}": f"http://127.0.0.1:{base + i}" for i in range(3)}
        yield Up(f"http://127.0.0.1:{port}", workers, run_dir, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _prompt(i: int) -> list[int]:
    return [(i * 29 + j * 11) % 900 + 20 for j in range(40 + 7 * i)]


async def _complete(client: AsyncOpenAI, i: int) -> tuple[str, int]:
    r = await client.completions.create(
        model="llama-3.1-8b", prompt=[_prompt(i)], max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert r.usage is not None
    return r.choices[0].text, r.usage.completion_tokens


async def _switch(up: Up, wid: str, role: str) -> float:
    """POST /role and wait until the worker is active in ``role``; the wall time."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(headers=_auth(), timeout=30) as c:
        r = await c.post(f"{up.workers[wid]}/role", json={"role": role, "drain": "wait"})
        assert r.status_code == 200, r.text
        while True:
            st = (await c.get(f"{up.workers[wid]}/role")).json()
            if st["state"] == "active" and st["role"] == role:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < 300, st
            await asyncio.sleep(0.1)


def _weight_loads(up: Up, wid: str) -> int:
    log = (up.run_dir / f"sglang-{wid}.log").read_text(errors="replace")
    return log.count("Load weight end")


def test_switches_under_load_lose_nothing_and_keep_the_process(up: Up) -> None:
    client = AsyncOpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0)
    before = {w: up.get(w, "/v1/internal/sglang").json() for w in up.workers}
    assert [before[w]["mode"] for w in ("w0", "w1", "w2")] == ["prefill", "prefill", "decode"]
    loads = {w: _weight_loads(up, w) for w in up.workers}
    assert all(n == 1 for n in loads.values()), loads

    async def run() -> tuple[dict[int, tuple[str, int]], list[tuple[int, tuple[str, int]]], float,
                             float]:  # fmt: skip
        refs = dict(zip(range(N_PROMPTS), await asyncio.gather(
            *(_complete(client, i) for i in range(N_PROMPTS))), strict=True))  # fmt: skip
        done: list[tuple[int, tuple[str, int]]] = []
        stop = asyncio.Event()

        async def stream(k: int) -> None:
            # A steady trickle: requests queued and in flight on every worker at each switch.
            n = 0
            while not stop.is_set() or n < 2:
                i = (k + n) % N_PROMPTS
                done.append((i, await _complete(client, i)))
                n += 1

        streams = [asyncio.ensure_future(stream(k)) for k in range(4)]
        await asyncio.sleep(2.0)
        p_to_d = await _switch(up, "w1", "decode")
        await asyncio.sleep(2.0)
        d_to_p = await _switch(up, "w2", "prefill")
        stop.set()
        await asyncio.gather(*streams)
        return refs, done, p_to_d, d_to_p

    refs, done, p_to_d, d_to_p = asyncio.run(run())
    print(f"P->D {p_to_d:.2f} s, D->P {d_to_p:.2f} s, {len(done)} requests under load")
    assert all(n == NEW_TOKENS for _, n in refs.values())
    assert len(done) >= 8
    for i, got in done:
        assert got == refs[i], (i, got, refs[i])  # every request, with the same greedy text

    after = {w: up.get(w, "/v1/internal/sglang").json() for w in up.workers}
    assert [after[w]["mode"] for w in ("w0", "w1", "w2")] == ["prefill", "decode", "prefill"]
    for w in up.workers:  # the same SGLang processes: no restart, weights loaded once
        assert after[w]["pid"] == before[w]["pid"] and after[w]["restarts"] == 0, (w, after[w])
        assert _weight_loads(up, w) == 1
    for wid, source, target in (("w1", "prefill", "decode"), ("w2", "decode", "prefill")):
        p = up.get(wid, "/pressure").json()
        assert p["role"] == target and p["state"] == "active" and p["switches"] == 1
        assert (p["last_switch_from"], p["last_switch_to"]) == (source, target)
        assert p["last_switch_finished"] > p["last_switch_started"] > 0
        m = up.get(wid, "/metrics").text
        labels = f'source="{source}",target="{target}",worker="{wid}"'
        assert f"fluidpd_role_switches_total{{{labels}}} 1.0" in m, m
        assert f'fluidpd_sglang_switch_seconds{{target="{target}",worker="{wid}"}}' in m
    # After the switches the deployment still serves, through the switched workers.
    fresh = AsyncOpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0)
    again = asyncio.run(_complete(fresh, 0))
    assert again == refs[0]
