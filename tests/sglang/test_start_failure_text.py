"""The one line a failed SGLang start is reported with (``fluidpd_sidecar.sglang.server``),
on log text as SGLang 0.5.17 writes it (lines taken from real failed starts on CPU: a truncated
weights file, a memory fraction too small for the weights). The real processes are in
test_sglang_start_failures.py."""

from __future__ import annotations

from pathlib import Path

from fluidpd_sidecar.sglang.server import exit_status, start_failure

OOM_TAIL = """\
[2026-12-02 04:03:19] Scheduler hit an exception: Traceback (most recent call last):
  File "/x/sglang/srt/managers/scheduler.py", line 953, in init_memory_pools
    self.init_target_memory_pool()
  File "/x/sglang/srt/mem_cache/kv_cache_configurator.py", line 1647, in _profile_available_bytes
    raise ValueError(
ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=1e-06.

[2026-12-02 04:03:19] Received sigquit from a child process. It usually means the child failed.
[2026-12-02 04:03:19] kill_process_tree called: parent_pid=26011, include_parent=True, pid=26011
"""

BAD_WEIGHTS_TAIL = """\
  File "/x/sglang/srt/model_loader/weight_utils.py", line 1131, in _load_file
    with safetensors.safe_open(st_file, framework="pt", device="cpu") as f:
safetensors._safetensors_rust.SafetensorError: Error while deserializing header: invalid length
[2026-12-02 04:04:43] Received sigquit from a child process. It usually means the child failed.
"""


def test_the_cause_is_the_exception_line_not_the_traceback(tmp_path: Path) -> None:
    log = tmp_path / "sglang-d0.log"
    log.write_text(OOM_TAIL)
    line = start_failure(log)
    assert line == (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        f"--mem-fraction-static=1e-06. (log: {log})"
    )
    log.write_text(BAD_WEIGHTS_TAIL)
    assert start_failure(log).startswith(
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing header"
    )


def test_only_this_start_counts(tmp_path: Path) -> None:
    """The log is appended to across restarts: an earlier start's error is not this one's."""
    log = tmp_path / "sglang-d0.log"
    log.write_text(BAD_WEIGHTS_TAIL)
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("usage: launch.py [-h] --model-path MODEL_PATH\n")
        f.write("launch.py: error: unrecognized arguments: --no-such-flag\n")
    line = start_failure(log, start)
    assert "SafetensorError" not in line
    assert "unrecognized arguments: --no-such-flag" in line and "\n" not in line


def test_long_causes_are_cut_and_a_missing_log_is_said(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    log.write_text("RuntimeError: " + "x" * 1000 + "\n")
    line = start_failure(log, limit=100)
    assert line.startswith("RuntimeError: xxx") and "x... (log: " in line
    assert len(line.split(" (log: ")[0]) == 100
    assert start_failure(tmp_path / "none.log") == f"(no log at {tmp_path / 'none.log'})"


def test_exit_status_names_signals() -> None:
    assert exit_status(1) == "exited with status 1"
    assert exit_status(-9) == "exited with status -9 (SIGKILL)"
