"""FluidToken on real SGLang 0.5.17 servers (CPU, the tiny random-weight Llama): through
``fluidpd up --engine sglang`` with the split pinned by ``--force-steal`` at beta = 0, 0.5 and
1, the official openai client gets the same greedy text as plain SGLang.

beta = 0.5: the prefill server computes the first half of each prompt and ships its KV, the
decode server runs the second half as an extend over it (``fluidtoken_hook``); beta = 1: the
prefill server is not asked at all and the decode server computes the whole prompt. A decode
server that skipped the suffix (SGLang's prebuilt path) would decode from a half-empty cache
and the prefill server's token of the wrong position, so the texts would differ.

Each stack also takes a burst of concurrent requests, which the pipelined prefill planner
(``--sglang-prefill-window 2``) releases to SGLang's prefill server two at a time: the next as
soon as SGLang's forward of the previous is done, while its KV is still in transfer (before the
pipelining the planner awaited each request's whole SGLang call: never more than one in the
prefill server). At beta = 1 the decode server computes the whole burst.

One stack per beta (each SGLang server takes 60-150 s to start on two cores), one plain server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from test_sglang_cpu import DTYPE, MAX_TOKENS, START_S, _free_ports, _text

from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer
from fluidpd_sidecar.sglang.wire import new_tokens

TOKEN = "t"
NEW = 12
LENGTHS = (23, 61)
WINDOW = 2
#: Prompt lengths of the burst (long enough that a prefill forward is not instant on CPU).
BURST = (301, 257, 420, 188, 350, 275)


def _prompt(k: int, n: int) -> list[int]:
    return [(13 * k + 11 * i) % 900 + 20 for i in range(n)]


@pytest.fixture(scope="module")
def plain(
    sglang_python: str, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangServer]:
    port, hook = _free_ports(2)
    server = SglangServer(
        SglangConfig(
            python=sglang_python, model_dir=tiny_llama_dir, port=port, hook_port=hook,
            device="cpu", max_total_tokens=MAX_TOKENS, start_timeout_s=START_S, dtype=DTYPE,
            log_path=tmp_path_factory.mktemp("plain") / "plain.log",
        )
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.start())
    try:
        yield server
    finally:
        loop.run_until_complete(server.stop())
        loop.close()


@pytest.fixture(scope="module", params=[0.0, 0.5, 1.0], ids=lambda b: f"beta={b}")
def up(
    request: pytest.FixtureRequest,
    sglang_python: str,
    tiny_llama_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[float, str, list[str]]]:
    run_dir = tmp_path_factory.mktemp("up")
    (port,) = _free_ports(1)
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "up", "--pd", "1P1D", "--engine", "sglang",
        "--device", "cpu", "--model-dir", str(tiny_llama_dir), "--port", str(port),
        "--base-port", str(port + 1), "--run-dir", str(run_dir),
        "--sglang-python", sglang_python, "--sglang-max-total-tokens", str(MAX_TOKENS),
        "--sglang-start-timeout", str(START_S), "--first-token-timeout", "300",
        "--sglang-dtype", DTYPE,
        "--force-steal", str(request.param), "--sglang-prefill-window", str(WINDOW),
    ]  # fmt: skip
    env = {**os.environ, "FLUIDPD_ADMIN_TOKEN": TOKEN, "FLUIDPD_LOG_DIR": str(run_dir)}
    out = (run_dir / "up.out").open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        t0 = time.monotonic()
        while not (run_dir / "endpoint").exists():  # written once every worker is ready
            assert proc.poll() is None, (run_dir / "up.out").read_text()[-3000:]
            assert time.monotonic() - t0 < START_S + 120, "fluidpd up did not come up"
            time.sleep(1.0)
        endpoint = (run_dir / "endpoint").read_text().strip()
        yield request.param, endpoint, [f"http://127.0.0.1:{port + 1 + i}" for i in range(2)]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _plain_ids(plain: SglangServer, ids: list[int], n: int) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    r = httpx.post(f"{plain.cfg.url}/generate", json=body, timeout=300)
    r.raise_for_status()
    return [t.id for t in new_tokens(r.json(), 0)]


def test_forced_split_greedy_text_equals_plain_sglang(
    up: tuple[float, str, list[str]], plain: SglangServer, tiny_llama_dir: Path
) -> None:
    beta, endpoint, workers = up
    client = OpenAI(base_url=f"{endpoint}/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    stolen = 0
    for k, length in enumerate(LENGTHS):
        ids = _prompt(k, length)
        ref = _plain_ids(plain, ids, NEW)
        got = client.completions.create(model=model, prompt=[ids], max_tokens=NEW, temperature=0)
        assert got.choices[0].text == _text(tiny_llama_dir, ref, NEW), (beta, length, ref)
        assert got.usage is not None and got.usage.completion_tokens == len(ref)
        stolen += length - round((1.0 - beta) * length)
    # The prefill worker's core scheduler made exactly the forced splits and reports them;
    # the decode worker advertises a budget from SGLang's decode state.
    prefill, decode = (httpx.get(f"{url}/pressure", timeout=10).json() for url in workers)
    assert (prefill["role"], decode["role"]) == ("prefill", "decode")
    assert prefill["stolen_tokens"] == stolen
    assert decode["steal_budget"] >= 0.0


def test_a_burst_is_pipelined_into_the_prefill_server_with_unchanged_greedy_text(
    up: tuple[float, str, list[str]], plain: SglangServer, tiny_llama_dir: Path
) -> None:
    beta, endpoint, (prefill_url, _) = up
    prompts = [[(17 * k + 7 * i) % 900 + 20 for i in range(n)] for k, n in enumerate(BURST)]
    refs = [_plain_ids(plain, ids, NEW) for ids in prompts]
    client = OpenAI(base_url=f"{endpoint}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    stolen_before = httpx.get(f"{prefill_url}/pressure", timeout=10).json()["stolen_tokens"]

    def complete(ids: list[int]) -> str:
        got = client.completions.create(model=model, prompt=[ids], max_tokens=NEW, temperature=0)
        return got.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:  # the whole burst at once
        texts = list(pool.map(complete, prompts))
    for ids, ref, text in zip(prompts, refs, texts, strict=True):
        assert text == _text(tiny_llama_dir, ref, NEW), (beta, len(ids), ref)

    info = httpx.get(
        f"{prefill_url}/v1/internal/sglang",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    ).json()
    assert info["prefill_window"] == WINDOW and info["prefill_in_flight"] == 0, info
    if beta < 1.0:  # (at beta = 1 the decode server computes every prompt whole)
        # More than one request in the prefill server at once, never more than the window.
        assert info["prefill_in_flight_max"] == WINDOW and info["prefill_overlapped"] >= 1, info
    stolen = httpx.get(f"{prefill_url}/pressure", timeout=10).json()["stolen_tokens"]
    assert stolen - stolen_before == sum(n - round((1.0 - beta) * n) for n in BURST)
