"""An SGLang that cannot start, through real processes: ``fluidpd sidecar --engine sglang`` on
CPU supervising a real SGLang 0.5.17 server that fails while loading.

- a bad model directory: FluidPD's own checks pass (config, tokenizer, generation config) but
  the weights file is truncated. The sidecar reads the safetensors headers before it spawns
  SGLang (``fluidpd.modeldir.weights``), so it exits at once with one line naming the file and
  the cause, and SGLang never starts (it used to fail in its loader after a minute of starting);
- a flag SGLang does not know (``--sglang-arg``): SGLang's argument parser exits at once;
- no SGLang at all under ``fluidpd up`` (its "SGLang python" is ``/bin/false``): ``up`` ends
  at once with one line naming the worker and its cause, not after ``--sglang-start-timeout``;
- out of memory: a model that does not fit the machine. The tiny model's tokenizer with a
  config whose embedding alone is 1 TiB (a 2**27-token vocabulary of width 4096): SGLang's
  allocation of it fails at once, whatever else the machine runs. (A too small
  ``--mem-fraction`` does not fail reliably on CPU: SGLang sizes its KV pool from the machine's
  available memory measured before and after loading the weights, and on a busy CI machine
  other processes freed more than 2, then 4 GiB of dummy weights meanwhile, so SGLang started.)

The sidecars of the last three answer ``/readyz`` 503 ("SGLang starting") while SGLang loads,
then exit non-zero with one line naming the cause (SGLang's exception, not its traceback) and
the log to read, instead of hanging. They start at once, after the bad model's sidecar has
exited (each SGLang start takes about a minute on two cores; two SGLang servers start here).
The operator's side (a NotReady pod) is in e2e/test_operator.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

START_S = 600.0
#: A Llama whose embedding is 2**27 x 4096 16-bit numbers, 1 TiB: more than any machine's memory
#: and swap, so the allocator refuses it at once instead of the kernel killing a process later.
BIG_SHAPE = {
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 2**27,
}  # fmt: skip
OOM_ARGS = ("--sglang-load-format", "dummy")


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
        "--port", "0", "--run-dir", str(run_dir),
    ]  # fmt: skip
    # Port 0: the kernel picks every port, so none can be taken between a look and a bind
    # (a fixed --port put the sidecars at --port + 101, which another process held once).
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
    big = logs / "big-model"
    shutil.copytree(tiny_llama_dir, big)
    config = json.loads((big / "config.json").read_text())
    config.update(BIG_SHAPE)
    (big / "config.json").write_text(json.dumps(config))
    runs = {
        "oom": _start(sglang_python, big, "oom", logs, *OOM_ARGS),
        "bad-flag": _start(
            sglang_python, tiny_llama_dir, "badflag", logs, "--sglang-arg=--no-such-sglang-flag"
        ),
    }
    try:
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


def test_bad_model_directory_is_one_line_before_sglang_starts(
    sglang_python: str, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_llama_dir, bad)
    weights = bad / "model.safetensors"
    (header,) = struct.unpack("<Q", weights.read_bytes()[:8])
    weights.write_bytes(weights.read_bytes()[:1000])
    t0 = time.monotonic()
    run = _start(sglang_python, bad, "badmodel", logs)
    run.code = run.proc.wait(START_S)
    took = time.monotonic() - t0
    assert run.code == 2, run.lines[-20:]
    assert run.lines == [
        f"fluidpd: error: --model-dir: {weights}: not a valid safetensors file: header says "
        f"{header} bytes, the file has 1000"
    ]
    # SGLang was never spawned (it would have written its log here), and no minute was spent.
    assert [p.name for p in logs.iterdir()] == ["badmodel.out"]
    assert took < START_S / 10, took


def test_out_of_memory_is_one_line_and_not_ready(failures: dict[str, Failed]) -> None:
    last = _check(failures["oom"], "DefaultCPUAllocator: can't allocate memory")
    assert str(2**27 * 4096 * 2) in last, last  # the bytes it tried to allocate


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
