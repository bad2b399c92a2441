"""``fluidpd compare``: two result sets run by run, in a table whose columns say what they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fluidpd.cli.main import main


def _results(directory: Path, attainment: dict[str, float], ttft_ms: float) -> Path:
    runs: list[dict[str, Any]] = [
        {"policy": policy, "rps": 20.0, "workload": "azure-mixed", "slo_attainment": value,
         "ttft_attainment": value, "tpot_attainment": 1.0, "failed": 0,
         "mean_ttft_ms": ttft_ms, "p99_ttft_ms": 3 * ttft_ms, "mean_tpot_ms": 40.0}
        for policy, value in attainment.items()
    ]  # fmt: skip
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps({"runs": runs}))
    return directory


def test_table_names_live_and_simulated_and_mean_ttft(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = _results(tmp_path / "live", {"static": 0.62, "fluidpd": 0.875}, 812.4)
    sim = _results(tmp_path / "sim", {"static": 0.65, "fluidpd": 0.79, "oracle": 0.9}, 790.0)
    out = tmp_path / "compare.json"
    argv = ["compare", str(live), str(sim), "--label-a", "live", "--label-b", "simulated"]
    assert main([*argv, "--out", str(out)]) == 0
    head, columns, *rows = capsys.readouterr().out.splitlines()
    assert "SLO attainment (%)" in head and "mean TTFT (ms)" in head
    assert columns.split() == [
        "workload", "rps", "policy", "live", "simulated", "live-simulated", "pp", "live",
        "simulated",
    ]  # fmt: skip
    assert rows[0].split() == ["azure-mixed", "20", "fluidpd", "87.5", "79.0", "+8.5", "812", "790"]
    assert rows[1].split() == ["azure-mixed", "20", "static", "62.0", "65.0", "-3.0", "812", "790"]
    doc = json.loads(out.read_text())
    assert doc["labels"] == {"a": "live", "b": "simulated"}
    assert doc["max_abs_diff_pp"] == 8.5
    assert [r["policy"] for r in doc["runs"]] == ["fluidpd", "static"]  # oracle: only in one


def test_default_labels_and_no_common_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _results(tmp_path / "a", {"static": 0.5}, 100.0)
    b = _results(tmp_path / "b", {"static": 0.5}, 100.0)
    assert main(["compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[3:] == ["A", "B", "A-B", "pp", "A", "B"]
    c = _results(tmp_path / "c", {"fluidpd": 0.5}, 100.0)
    assert main(["compare", str(a), str(c)]) == 2
    assert "no run (workload, rps, policy) appears in both" in capsys.readouterr().err
