"""FluidToken's pipelined prefill planner on real SGLang 0.5.17 servers (CPU, the tiny
random-weight Llama): through ``fluidpd up --engine sglang --sglang-prefill-window 2`` with the
split pinned at beta = 0.5, a burst of concurrent requests is released to SGLang's prefill server
two at a time (the next one as soon as SGLang's forward of the previous is done, while its KV is
still in transfer), and every greedy text equals plain SGLang's.

Before the pipelining the planner awaited each request's whole SGLang call, so at most one
request was ever in the prefill server (``prefill_in_flight_max`` 1, ``prefill_overlapped`` 0).
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
from test_sglang_cpu import MAX_TOKENS, START_S, _free_ports, _text

from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer
from fluidpd_sidecar.sglang.wire import new_tokens

TOKEN = "t"
NEW = 8
WINDOW = 2
#: Prompt lengths of the burst (long enough that a prefill forward is not instant on CPU).
LENGTHS = (301, 257, 420, 188, 350, 275)


def _prompt(k: int, n: int) -> list[int]:
    return [(17 * k + 7 * i) % 900 + 20 for i in range(n)]


@pytest.fixture(scope="module")
def plain(
    sglang_python: str, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangServer]:
    port, hook = _free_ports(2)
    server = SglangServer(
        SglangConfig(
            python=sglang_python, model_dir=tiny_llama_dir, port=port, hook_port=hook,
            device="cpu", max_total_tokens=MAX_TOKENS, start_timeout_s=START_S,
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


@pytest.fixture(scope="module")
def up(
    sglang_python: str, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[str]]]:
    run_dir = tmp_path_factory.mktemp("up")
    (port,) = _free_ports(1)
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "up", "--pd", "1P1D", "--engine", "sglang",
        "--device", "cpu", "--model-dir", str(tiny_llama_dir), "--port", str(port),
        "--base-port", str(port + 1), "--run-dir", str(run_dir),
        "--sglang-python", sglang_python, "--sglang-max-total-tokens", str(MAX_TOKENS),
        "--sglang-start-timeout", str(START_S), "--first-token-timeout", "300",
        "--force-steal", "0.5", "--sglang-prefill-window", str(WINDOW),
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
        yield endpoint, [f"http://127.0.0.1:{port + 1 + i}" for i in range(2)]
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


def test_burst_is_pipelined_into_the_prefill_server_with_unchanged_greedy_text(
    up: tuple[str, list[str]], plain: SglangServer, tiny_llama_dir: Path
) -> None:
    endpoint, (prefill_url, _) = up
    prompts = [_prompt(k, n) for k, n in enumerate(LENGTHS)]
    refs = [_plain_ids(plain, ids, NEW) for ids in prompts]
    client = OpenAI(base_url=f"{endpoint}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id

    def complete(ids: list[int]) -> str:
        got = client.completions.create(model=model, prompt=[ids], max_tokens=NEW, temperature=0)
        return got.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:  # the whole burst at once
        texts = list(pool.map(complete, prompts))
    for ids, ref, text in zip(prompts, refs, texts, strict=True):
        assert text == _text(tiny_llama_dir, ref, NEW), (len(ids), ref)

    info = httpx.get(
        f"{prefill_url}/v1/internal/sglang",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    ).json()
    assert info["prefill_window"] == WINDOW
    # More than one request was in the prefill server at once, never more than the window,
    # and none is left there.
    assert info["prefill_in_flight_max"] == WINDOW, info
    assert info["prefill_overlapped"] >= 1, info
    assert info["prefill_in_flight"] == 0, info
    pressure = httpx.get(f"{prefill_url}/pressure", timeout=10).json()
    assert pressure["stolen_tokens"] == sum(n - round(0.5 * n) for n in LENGTHS)
