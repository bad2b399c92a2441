"""An SGLang that cannot start, through real processes: ``fluidpd sidecar --engine sglang`` on
CPU supervising a real SGLang 0.5.17 server that fails while loading.

- a bad model directory: FluidPD's own checks pass (config, tokenizer, generation config) but
  the weights file is truncated, so SGLang's loader fails;
- a flag SGLang does not know (``--sglang-arg``): SGLang's argument parser exits at once;
- no SGLang at all under ``fluidpd up`` (its "SGLang python" is ``/bin/false``): ``up`` ends
  at once with one line naming the worker and its cause, not after ``--sglang-start-timeout``;
- out of memory: SGLang's own KV-pool sizing fails, as on a GPU given too small a
  ``--mem-fraction``: on CPU SGLang measures the machine's available memory before and after
  loading the weights, so the model must outweigh what other processes free meanwhile (the
  tiny model's few MB did not, nor did 2 GiB in CI, 2026-12-03, while the other xdist worker
  ran SGLang servers and this module's bad-model SGLang exited: SGLang started). The model is
  the tiny one's tokenizer with a 2.1B-parameter config (about 4 GiB in 16 bits), weights from
  SGLang's ``--load-format dummy``, under ``--mem-fraction 1e-6``; it runs before the bad-model
  SGLang starts, so no SGLang of this module exits while it measures.

Each sidecar answers ``/readyz`` 503 ("SGLang starting") while SGLang loads, then exits
non-zero with one line naming the cause (SGLang's exception, not its traceback) and the log to
read, instead of hanging. The OOM and bad-flag ones start at once, the bad-model one when they
are over (each SGLang start takes about a minute on two cores). The operator's side (a NotReady
pod) is in e2e/test_operator.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

START_S = 600.0
#: A Llama of about 2.15B parameters: 32 layers of 16.8M attention and 50.3M MLP weights.
BIG_SHAPE = {
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
}  # fmt: skip
OOM_ARGS = ("--mem-fraction", "0.000001", "--sglang-load-format", "dummy")


@dataclass
class Failed:
    proc: subprocess.Popen[bytes]
    port: int
    out: Path
    readyz: list[tuple[int, str]] = field(default_factory=list)
    code: int | None = None

    @property
    def over(self) -> bool:
        """Exited, or ready after all (then its test fails at once instead of waiting)."""
        return self.code is not None or any(code == 200 for code, _ in self.readyz)

    @property
    def lines(self) -> list[str]:
        return [line for line in self.out.read_text(errors="replace").splitlines() if line]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(python: str, model: Path, wid: str, logs: Path, *extra: str) -> Failed:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "sidecar", "--id", wid, "--role", "decode",
        "--port", str(port), "--engine", "sglang", "--device", "cpu", "--model-dir", str(model),
        "--sglang-python", python, "--sglang-max-total-tokens", "4096",
        "--sglang-start-timeout", str(START_S), *extra,
    ]  # fmt: skip
    out = logs / f"{wid}.out"
    env = {**os.environ, "FLUIDPD_LOG_DIR": str(logs)}
    proc = subprocess.Popen(cmd, env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT)
    return Failed(proc, port, out)


def _watch(runs: dict[str, Failed]) -> None:
    """Polls each run's exit and ``/readyz`` until every run is over (or the start limit)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_S + 60 and not all(r.over for r in runs.values()):
        for r in runs.values():
            if r.over:
                continue
            r.code = r.proc.poll()
            with contextlib.suppress(httpx.HTTPError):
                got = httpx.get(f"http://127.0.0.1:{r.port}/readyz", timeout=5)
                r.readyz.append((got.status_code, got.text))
        time.sleep(0.5)


@dataclass
class Up:
    proc: subprocess.Popen[str]
    run_dir: Path
    t0: float


@pytest.fixture(scope="module")
def up_without_sglang(
    tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Up]:
    run_dir = tmp_path_factory.mktemp("up-no-sglang") / "run"
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "up", "--engine", "sglang", "--pd", "1P1D",
        "--policy", "static", "--device", "cpu", "--model-dir", str(tiny_llama_dir),
        "--sglang-python", "/bin/false", "--sglang-start-timeout", str(START_S),
        "--port", str(_free_port()), "--run-dir", str(run_dir),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield Up(proc, run_dir, time.monotonic())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def failures(
    sglang_python: str,
    tiny_llama_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    up_without_sglang: Up,  # started first, so that it fails while these do
) -> Iterator[dict[str, Failed]]:
    logs = tmp_path_factory.mktemp("sglang-failures")
    bad = logs / "bad-model"
    shutil.copytree(tiny_llama_dir, bad)
    for weights in bad.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:1000])
    big = logs / "big-model"
    shutil.copytree(tiny_llama_dir, big)
    config = json.loads((big / "config.json").read_text())
    config.update(BIG_SHAPE)
    (big / "config.json").write_text(json.dumps(config))
    runs = {
        "oom": _start(sglang_python, big, "oom", logs, *OOM_ARGS),
        # Ends in SGLang's argument parser, before the OOM run measures any memory.
        "bad-flag": _start(
            sglang_python, tiny_llama_dir, "badflag", logs, "--sglang-arg=--no-such-sglang-flag"
        ),
    }
    try:
        _watch(runs)
        runs["bad-model"] = _start(sglang_python, bad, "badmodel", logs)
        _watch(runs)
        yield runs
    finally:
        for r in runs.values():
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait(10)


def _check(run: Failed, *cause: str) -> str:
    assert run.code is not None, "the sidecar still runs: SGLang's failure was not noticed"
    assert run.code != 0
    # NotReady while SGLang loaded, never ready.
    assert run.readyz, "the sidecar never answered /readyz"
    assert all(code == 503 for code, _ in run.readyz), run.readyz
    assert any("SGLang starting" in body for _, body in run.readyz), run.readyz
    lines = run.lines
    last = lines[-1]
    assert last.startswith("fluidpd: error: sglang: SGLang exited with status"), last
    for part in cause:
        assert part in last, last
    assert "(log: " in last and last.rstrip().endswith(".log)"), last
    # SGLang's traceback stays in its log; the sidecar's own output has none.
    assert not any("Traceback" in line for line in lines), lines[-20:]
    return last


def test_bad_model_directory_is_one_line_and_not_ready(failures: dict[str, Failed]) -> None:
    _check(failures["bad-model"], "SafetensorError", "header")


def test_out_of_memory_is_one_line_and_not_ready(failures: dict[str, Failed]) -> None:
    last = _check(failures["oom"], "ValueError: Loaded weights leave no GPU memory for the KV")
    assert "--mem-fraction-static=1e-06" in last, last


def test_sglang_that_cannot_start_is_one_line_and_nonzero(failures: dict[str, Failed]) -> None:
    run = failures["bad-flag"]
    # (It can exit before the first /readyz poll, so only its exit and its last line count.)
    assert run.code is not None and run.code != 0, run.lines[-20:]
    last = run.lines[-1]
    assert "SGLang exited with status" in last and "no-such-sglang-flag" in last, last


def test_a_stack_whose_sglang_cannot_start_says_why_at_once(
    failures: dict[str, Failed], up_without_sglang: Up
) -> None:
    up = up_without_sglang
    _, err = up.proc.communicate(timeout=START_S)
    took = time.monotonic() - up.t0
    assert up.proc.returncode != 0, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fluidpd: error: the stack did not come up (w"), last
    assert " exited with status " in last, last  # the worker, then its own last line
    assert "SGLang exited with status 1" in last, last
    assert last.endswith(f"see the logs in {up.run_dir}"), last
    assert took < START_S / 2, took  # it did not wait out the start limit
