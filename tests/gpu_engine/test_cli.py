"""`fluidpd profile`, the gpu options of `sidecar`/`up`, and a live gpu-engine stack on CPU."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fluidpd.cli.main import main
from fluidpd.profiles import load_profile_file

TINY = ["--engine-model", "tiny-llama", "--device", "cpu", "--dtype", "float32"]


def _profile(tmp_path: Path) -> Path:
    out = tmp_path / "tiny-llama-cpu.yaml"
    code = main(
        ["profile", *TINY, "--gpu", "cpu", "--kv-tokens", "12000", "--context-limit", "4096",
         "--max-running", "16", "--quick", "--max-mre", "1", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    return out


def test_profile_measures_fits_and_refits(tmp_path: Path) -> None:
    out = _profile(tmp_path)
    profile = load_profile_file(out)
    assert profile.model == "tiny-llama" and profile.gpu == "cpu"
    assert profile.kv.bytes_per_token == 2 * 2 * 16 * 2 * 4  # layers x K,V x kvh x d x fp32
    report = json.loads(out.with_suffix(".json").read_text())
    assert set(report["mre"]) == {"prefill", "suffix", "decode"}
    assert report["switch"]["weights_unmoved"] is True
    refit = tmp_path / "refit.yaml"
    report_copy = str(tmp_path / "r.json")
    argv = ["profile", "--from-report", str(out.with_suffix(".json")), "--gpu", "cpu"]
    assert main([*argv, "--max-mre", "1", "--out", str(refit), "--report", report_copy]) == 0
    assert load_profile_file(refit).prefill == profile.prefill


DEVICE_SIDECAR = ["sidecar", "--id", "w0", "--role", "prefill", "--engine", "gpu"]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["profile", "--engine-model", "gpt-9", "--out", "x.yaml"], "--engine-model"),
        (["profile", *TINY, "--kv-tokens", "100", "--out", "x.yaml"], "--kv-tokens"),
        (["profile", *TINY, "--out", "x.yaml"], "--kv-tokens"),
        (["profile", "--from-report", "missing.json", "--out", "x.yaml"], "--from-report"),
        (["up", "--engine", "gpu", "--pd", "1P1D"], "--kv-transfer"),
        (["up", "--engine", "gpu", "--kv-transfer", "shm", "--device", ","], "--device"),
        (["up", "--engine", "gpu", "--kv-transfer", "shm", "--device", "cpu,cuda:x"],
         "--device: 'cuda:x' is not a torch device"),
        (["profile", "--engine-model", "tiny-llama", "--device", "mps", "--kv-tokens", "9000",
          "--out", "x.yaml"], "--device: 'mps': the gpu engine runs on cuda or cpu"),
        ([*DEVICE_SIDECAR, "--kv-transfer", "shm", "--device", "cuda:x"],
         "--device: 'cuda:x' is not a torch device"),
        ([*DEVICE_SIDECAR, *TINY, "--kv-transfer", "shm", "--kv-arena-mib", "1"],
         "--kv-arena-mib: 1 MiB cannot hold the KV of one request at the context limit"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_field(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


def test_triton_decode_kernel_matches_the_reference_in_the_interpreter() -> None:
    """The GPU decode kernel's logic, run by Triton's CPU interpreter against gather + SDPA."""
    pytest.importorskip("triton")
    code = """
import numpy as np, torch, triton.runtime.interpreter as I
_orig = I._patch_lang_tensor
def patched(tensor, scope):  # numpy >= 2.5 refuses int() of a 1-element array
    _orig(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda s: int(np.asarray(s.handle.data).reshape(-1)[0]))
I._patch_lang_tensor = patched
from fluidpd_sidecar.gpu.attention import decode_attention_reference, decode_attention_triton
torch.manual_seed(0)
k, v = torch.randn(20, 16, 2, 32), torch.randn(20, 16, 2, 32)
table = torch.randint(1, 20, (3, 8), dtype=torch.int32)
lens = torch.tensor([1, 37, 100], dtype=torch.int32)
q = torch.randn(3, 8, 32)
ref = decode_attention_reference(q, k, v, table, lens)
print(float((ref - decode_attention_triton(q, k, v, table, lens)).abs().max()))
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-4


def test_live_stack_serves_with_the_gpu_engine(tmp_path: Path) -> None:
    """`fluidpd up --engine gpu` (1P1D, tiny shape on CPU, shm hand-off) answers completions;
    ``--device`` as a list gives each worker its own entry (one worker per GPU on a GPU host).
    The decode side's arena (3 MiB: one request at the 4K context limit, three of 1,600
    tokens) is smaller than a burst's KV: hand-offs wait for room, none fails or is redone."""
    profile = _profile(tmp_path)
    run_dir = tmp_path / "up"
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen(
        [sys.executable, "-m", "fluidpd.cli.main", "up", *TINY, "--engine", "gpu",
         "--profile", str(profile), "--kv-transfer", "shm", "--kv-arena-mib", "3",
         "--device", "cpu,cpu",
         "--pd", "1P1D", "--policy", "fluidpd", "--port", str(port), "--run-dir", str(run_dir),
         "--ready-timeout", "170"],  # three processes importing torch on a shared CPU
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.time() + 180
        while not (run_dir / "endpoint").exists():
            assert proc.poll() is None and time.time() < deadline, "stack did not come up"
            time.sleep(0.5)

        def complete(n: int) -> dict[str, Any]:
            prompt = [i % 500 + 1 for i in range(n)]
            # Sampled (temperature 1), through EOS: every request has its 6 tokens.
            body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
            return answer

        for n in (40, 280, 2000):  # split prefill, stolen suffixes
            answer = complete(n)
            assert answer["usage"]["completion_tokens"] == 6
            assert answer["choices"][0]["finish_reason"] == "length"
        with ThreadPoolExecutor(8) as pool:
            burst = list(pool.map(complete, [1600] * 8))
        assert [a["usage"]["completion_tokens"] for a in burst] == [6] * 8
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "fluidpd_router_repairings 0.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    for log in run_dir.glob("w*.log"):
        assert "Traceback" not in log.read_text(), log
    for pid_file in run_dir.glob("w*.pid"):  # the workers' shm arenas went with them
        assert not list(Path("/dev/shm").glob(f"fluidpd-kv-{pid_file.read_text().strip()}-*"))


@pytest.mark.parametrize("damage", ["architecture", "shard"])
def test_a_bad_model_dir_is_one_line_at_start(
    damage: str, tiny_qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gpu engine's checks of a model directory reach the CLI as one line naming the file."""
    d = tmp_path / "model"
    shutil.copytree(tiny_qwen3_dir, d)
    if damage == "architecture":
        cfg = json.loads((d / "config.json").read_text())
        cfg["architectures"] = ["GPT2LMHeadModel"]
        (d / "config.json").write_text(json.dumps(cfg))
        says = f"--model-dir: {d / 'config.json'}: architecture GPT2LMHeadModel is not supported"
    else:
        shard = sorted(d.glob("model-*.safetensors"))[0]
        shard.unlink()
        says = f"--model-dir: {shard}: missing"
    argv = [*DEVICE_SIDECAR, "--model-dir", str(d), "--device", "cpu", "--dtype", "float32",
            "--kv-transfer", "shm", "--kv-arena-mib", "8"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"fluidpd: error: {says}"), err
