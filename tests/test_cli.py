"""The ``fluidpd`` console script, run as a real process."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

RUN_FIELDS = {
    "policy", "rps", "workload", "model", "gpu", "pd", "slo_attainment", "ttft_attainment",
    "tpot_attainment", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "median_tpot_ms", "p99_tpot_ms", "completed", "failed", "duration", "request_throughput",
    "output_throughput", "role_switches", "stolen_tokens",
}  # fmt: skip


def fluidpd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fluidpd")
    assert exe, "the fluidpd console script is not installed (pip install -e .)"
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=600, cwd=cwd, check=False
    )


def small_sim(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return fluidpd(
        "sim", "--workload", "azure-mixed", "--rps", "25,40", "--num-requests", "600",
        "--policy", "static,fluidpd,oracle", "--quiet", "--jobs", "1", "--out", str(out), *extra,
    )  # fmt: skip


def test_sim_writes_the_results_contract_and_plots(tmp_path: Path) -> None:
    proc = small_sim(tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 6
    assert {(r["policy"], r["rps"]) for r in runs} == {
        (p, r) for p in ("static", "fluidpd", "oracle") for r in (25.0, 40.0)
    }
    for r in runs:
        assert set(r) >= RUN_FIELDS, RUN_FIELDS - set(r)
        for key in ("slo_attainment", "ttft_attainment", "tpot_attainment"):
            assert 0.0 <= r[key] <= 1.0
        assert r["slo_attainment"] <= min(r["ttft_attainment"], r["tpot_attainment"])
        assert r["completed"] + r["failed"] == 600
        for s in r["role_switches"]:
            assert set(s) == {"t", "worker", "from", "to", "drain_s"}
    by = {(r["policy"], r["rps"]): r for r in runs}
    # The oracle is the best static split in hindsight: never below the fixed 4P4D.
    assert by[("oracle", 40.0)]["slo_attainment"] >= by[("static", 40.0)]["slo_attainment"]
    for name in ("attainment_vs_rps.png", "command.txt"):
        assert (tmp_path / name).stat().st_size > 0, name
    # static, fluidpd and oracle are not the component ablation: no ablation.png for them.
    assert not (tmp_path / "ablation.png").exists()
    assert list(tmp_path.glob("timeseries_azure-mixed_*.png"))
    assert list((tmp_path / "timeseries").glob("*.json"))
    assert "SLO attainment" in proc.stdout and "static" in proc.stdout


def test_same_seed_gives_identical_results(tmp_path: Path) -> None:
    """Two runs of one seed (to different directories, so with different commands) write
    byte-identical results.json; the command and wall times are in run.json."""
    texts = []
    for name in ("a", "b"):
        assert small_sim(tmp_path / name, "--no-plots").returncode == 0
        texts.append((tmp_path / name / "results.json").read_bytes())
    assert texts[0] == texts[1]
    doc = json.loads(texts[0])
    assert set(doc) == {"runs", "fluidpd_version"}
    assert all("wall_s" not in r for r in doc["runs"])
    run = json.loads((tmp_path / "b" / "run.json").read_text())
    assert str(tmp_path / "b") in run["command"]
    timed = {(w["policy"], w["rps"]) for w in run["wall_s"]}
    assert timed == {(r["policy"], r["rps"]) for r in doc["runs"]}
    assert all(w["wall_s"] >= 0 for w in run["wall_s"])
    other = small_sim(tmp_path / "c", "--no-plots", "--seed", "1")
    assert other.returncode == 0
    changed = json.loads((tmp_path / "c" / "results.json").read_text())["runs"]
    assert [r["mean_ttft_ms"] for r in changed] != [r["mean_ttft_ms"] for r in doc["runs"]]


BAD_OPTIONS = [
    (["--rps", "abc"], "argument --rps: expected a number, got 'abc'"),
    (["--rps", "10,-5"], "argument --rps: must be positive, got '-5'"),
    (["--pd", "4X4"], "--pd"),
    (["--pd", "0P4D"], "--pd"),
    (["--policy", "fastest"], "--policy"),
    (["--ttft-slo", "0"], "argument --ttft-slo: must be positive, got '0'"),
    (["--num-requests", "0"], "argument --num-requests: must be positive, got '0'"),
    (["--num-requests", "1.5"], "argument --num-requests: expected an integer, got '1.5'"),
    (["--workload", "no-such-workload"], "no-such-workload"),
    (["--model", "gpt-17"], "gpt-17"),
    (["--drain-mode", "never"], "--drain-mode"),
    (["--ppi-low", "2", "--ppi-high", "1"], "ppi_low"),
    (["--min-prefill", "5", "--min-decode", "5"], "--min-prefill"),
]


@pytest.mark.parametrize(("args", "named"), BAD_OPTIONS)
def test_bad_options_fail_in_one_line(tmp_path: Path, args: list[str], named: str) -> None:
    proc = fluidpd("sim", "--quiet", "--out", str(tmp_path), *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert named in lines[0]
    assert not (tmp_path / "results.json").exists()


def test_bad_trace_file_names_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,100,10\n"
        "2023-11-16 18:17:04.0000000,many,10\n"
    )
    proc = fluidpd("sim", "--workload", str(trace), "--quiet", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert str(trace) in proc.stderr and ":3" in proc.stderr


def test_malformed_profile_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    src = Path(__file__).resolve().parents[1] / "profiles" / "llama-3.1-8b-a100-80gb.yaml"
    bad.write_text(src.read_text().replace("c1_ms_per_token: 0.07", "c1_ms_per_token: -1"))
    proc = fluidpd("sim", "--profile", str(bad), "--quiet", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "bad.yaml" in proc.stderr and "c1_ms_per_token" in proc.stderr


def test_trace_file_workload_runs(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = [
        f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,{200 + 37 * i},{5 + i}" for i in range(60)
    ]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    proc = fluidpd(
        "sim", "--workload", str(trace), "--rps", "5", "--policy", "static,fluidpd",
        "--quiet", "--no-plots", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "o" / "results.json").read_text())["runs"]
    assert all(r["completed"] == 60 for r in runs)


def test_bench_writes_json(tmp_path: Path) -> None:
    proc = fluidpd(
        "bench", "--depth", "64", "--iterations", "50", "--skip-replay", "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "bench.json").read_text())
    ctl = doc["control_iteration"]
    assert ctl["queue_depth"] == 64
    assert ctl["scheduler_iteration"]["median_us"] > 0
    assert ctl["full_algorithm1"]["median_us"] > 0


def test_profiles_lists_shipped_profiles() -> None:
    proc = fluidpd("profiles")
    assert proc.returncode == 0
    assert "llama-3.1-8b-a100-80gb" in proc.stdout.split()


def test_summary_reprints_results_and_rejects_bad_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert small_sim(out, "--no-plots", "--series-json", "plotted").returncode == 0
    # Only the plotted rate's (here the middle of 25,40 -> 40) series are kept.
    assert {p.name.split("_")[1] for p in (out / "timeseries").glob("*.json")} == {"40rps"}
    (out / "summary.txt").unlink()
    proc = fluidpd("summary", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "FluidPD against the baselines" in proc.stdout
    assert (out / "summary.txt").read_text().startswith("azure-mixed:")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text('{"runs": [{"policy": "static"}]}')
    proc = fluidpd("summary", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "runs[0] lacks" in proc.stderr


@pytest.mark.parametrize("command", ["sidecar", "up"])
def test_an_sglang_only_option_with_another_engine_is_refused(command: str) -> None:
    """Not taken and ignored: the sidecar and ``up`` both name it and exit 2."""
    extra = ["--id", "w0", "--role", "decode"] if command == "sidecar" else ["--pd", "1P1D"]
    proc = fluidpd(command, *extra, "--engine", "sim", "--sglang-prefill-batching")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == "fluidpd: error: --sglang-prefill-batching: only with --engine sglang"
    )


@pytest.mark.parametrize("command", ["sim", "router", "up"])
def test_every_command_that_pairs_offers_every_pairing(command: str) -> None:
    proc = fluidpd(command, "--pairing", "fastest")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    offered = "'round-robin', 'least-loaded', 'random'"
    assert f"--pairing: invalid choice: 'fastest' (choose from {offered})" in proc.stderr
