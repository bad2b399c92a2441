"""``python -m harness.drill_operator`` (e2e/harness): one-line errors for bad arguments, and the
accounting that turns the load's outcomes into per-kill counts. The drill itself needs the test
control plane; ``e2e/test_operator_chaos.py`` runs its steps there."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from fluidpd.drills.load import Outcome
from harness.drill_operator import summarize
from harness.load import HANG_S
from harness.operator import Operator
from harness.operator_chaos import Kill, account

E2E = Path(__file__).resolve().parents[1] / "e2e"


def drill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.drill_operator", *args],
        cwd=E2E, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rounds", "0"], "argument --rounds: must be positive, got '0'"),
        (["--rounds", "two"], "argument --rounds: expected an integer, got 'two'"),
        (["--rps", "-1"], "argument --rps: must be positive, got '-1'"),
        (["--duration", "nan"], "argument --duration: must be positive, got 'nan'"),
        (["--seed", "-3"], "argument --seed: must be >= 0, got '-3'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--out", "."], "argument --out: . is a directory"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    proc = drill(*args)
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert proc.stderr == f"python -m harness.drill_operator: error: {says}\n"


def test_a_run_dir_with_files_in_it_is_refused(tmp_path: Path) -> None:
    (tmp_path / "old.log").write_text("x")
    proc = drill("--run-dir", str(tmp_path), "--out", str(tmp_path / "r.json"))
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), proc
    assert f"argument --run-dir: {tmp_path} is not empty" in proc.stderr


def test_help_says_why_it_is_not_a_fluidpd_drill() -> None:
    proc = drill("--help")
    assert proc.returncode == 0
    assert "not shipped in the fluidpd package" in " ".join(proc.stdout.split())


def _outcome(start: float, end: float, ok: bool = True) -> Outcome:
    return Outcome(start, end, status=200 if ok else 502, tokens=5, expected=5)


def test_every_request_lands_in_exactly_one_kills_window() -> None:
    # Kill 1 at t=10, done at 14; kill 2 at t=20, done at 25 (restart at 21 + 4 s).
    k1 = Kill("scale-in: retire annotation set", "w1", "6->5", 10.0, restarted_at=11.0,
              completed_s=3.0, routed_s=3.0)  # fmt: skip
    k2 = Kill("switch: intent only", "w2", "decode->prefill (migrate)", 20.0, restarted_at=21.0,
              completed_s=2.0, routed_s=4.0)  # fmt: skip
    outcomes = [
        _outcome(1.0, 12.0),  # k1's window, in flight at its kill
        _outcome(13.9, 16.0, ok=False),  # k1's window (before 14), failed
        _outcome(14.0, 30.0),  # k2's window, in flight at kill 2
        _outcome(19.0, 19.0 + HANG_S + 1),  # k2's: completed, but hung by its duration
        _outcome(26.0, 0.0),  # after k2's done: still the last window; never ended: hung
    ]
    account(outcomes, [k1, k2])
    assert k1.requests == {
        "sent": 2, "completed": 1, "failed": 1, "hung": 0,
        "in_flight_at_kill": 1, "in_flight_at_kill_completed": 1,
    }  # fmt: skip
    assert k2.requests == {
        "sent": 3, "completed": 1, "failed": 0, "hung": 2,
        "in_flight_at_kill": 2, "in_flight_at_kill_completed": 1,
    }  # fmt: skip


def test_a_kill_whose_change_never_completed_closes_its_window_at_the_kill() -> None:
    stuck = Kill("switch: sidecar draining", "w0", "prefill->decode (wait)", 10.0)
    after = Kill("switch: intent only", "w1", "decode->prefill (migrate)", 30.0)
    account([_outcome(5.0, 6.0), _outcome(12.0, 13.0)], [stuck, after])
    assert (stuck.requests["sent"], after.requests["sent"]) == (1, 1)


def test_the_summary_is_ok_only_when_nothing_was_lost() -> None:
    kill = {"where": "switch: intent only", "completed_s": 1.5, "routed_s": 2.0,
            "pod_restarts": 0, "mid_way": None, "operator_up_s": 1.0}  # fmt: skip
    load = {"sent": 10, "completed": 10, "failed_clearly": 0, "hung": 0, "errors": {}}
    phase = {"round": 0, "phase": "switch", "error": "", "kills": [kill], "requests": load,
             "pod_restarts": 0, "pods_replaced": []}  # fmt: skip
    totals = summarize([phase])
    assert totals["ok"] and totals["by_where"]["switch: intent only"]["completed"] == 1
    lost = phase | {"requests": load | {"completed": 9, "failed_clearly": 1, "errors": {"x": 1}}}
    assert not summarize([lost])["ok"]
    assert not summarize([phase | {"pod_restarts": 1}])["ok"]
    assert not summarize([phase | {"kills": [kill | {"completed_s": None}]}])["ok"]
    assert not summarize([phase | {"error": "TimeoutError: ..."}])["ok"]
    assert not summarize([])["ok"]


def test_the_operators_start_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    op = Operator(None, "ns", log)  # type: ignore[arg-type]  # reads its log only
    assert op.up_since(0.0) is None  # no log yet
    startup = "INFO kopf.activities.startup: Activity 'startup' succeeded."
    log.write_text(
        f"2026-12-03 01:37:26,487 {startup}\n"
        "2026-12-03 01:37:27,000 INFO kopf.objects: Resuming is processed\n"
        f"2026-12-03 01:38:31,763 {startup}\n"
    )
    first = datetime.datetime(2026, 12, 3, 1, 37, 26, 487000).timestamp()
    second = datetime.datetime(2026, 12, 3, 1, 38, 31, 763000).timestamp()
    assert op.up_since(first - 5) == pytest.approx(first)
    # A restart after the first start: the next startup line, not the old one.
    assert op.up_since(first + 1) == pytest.approx(second)
    assert op.up_since(second + 1) is None
