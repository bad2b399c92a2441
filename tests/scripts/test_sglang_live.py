"""``scripts/gpu/sglang_live.py``'s profile, checked on CPU: the shipped 8B profile of the card the
run got (``--gpu``) with the live deployment's KV pool, running cap and KV transfer speed put in,
everything else as shipped."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import yaml

from fluidpd.core.profile import Profile
from fluidpd.profiles import resolve_profile

GPU = Path(__file__).resolve().parents[2] / "scripts" / "gpu"
sys.path.insert(0, str(GPU))

import sglang_live  # noqa: E402


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_live_profile_is_the_cards_profile_with_the_deployments_pool_cap_and_transfer(
    tmp_path: Path, gpu: str
) -> None:
    args = argparse.Namespace(kv_tokens=65536, graph_bs=64, transfer_gbps=0.27, gpu=gpu)
    path = sglang_live.live_profile(args, tmp_path)
    assert path == tmp_path / "profile.yaml"
    live = Profile.model_validate(yaml.safe_load(path.read_text()))
    shipped = resolve_profile("llama-3.1-8b", gpu, None)
    assert live.name == f"llama-3.1-8b-{gpu}-sglang-live"
    assert live.kv.capacity_tokens == 65536
    assert live.max_running_requests == 64
    assert live.transfer.bandwidth_gb_per_s == 0.27
    # The predictors the planner and the controller's forecast use are the measured ones.
    assert (live.prefill, live.suffix, live.decode) == (
        shipped.prefill, shipped.suffix, shipped.decode,
    )  # fmt: skip
    assert live.kv.bytes_per_token == shipped.kv.bytes_per_token
    assert live.n_tpot(0.05) == min(64, shipped.n_tpot(0.05))  # the running cap bounds N_TPOT


def test_runs_go_static_then_fluidtoken_then_fluidpd() -> None:
    assert sglang_live.RUNS == ("static", "fluidtoken", "fluidpd")


def test_the_four_8b_servers_fit_the_h200_and_not_the_h100() -> None:
    """The H100 start that failed on 2026-12-06: 81,559 MiB, four 8B servers with 65,536-token
    pools; the H200 (143,771 MiB) ran them on 2026-12-02."""
    args = argparse.Namespace(model_dir=None, shape="llama-3.1-8b", kv_tokens=65536)
    per_token = sglang_live.live_profile_data(argparse.Namespace(gpu="h100"))["kv"]
    needed = sglang_live.memory_needed(args, int(per_token["bytes_per_token"]))
    assert 95 * 2**30 < needed < 105 * 2**30
    why = sglang_live.fits_message(needed, 81559 * 2**20)
    assert why is not None and "GiB" in why and "--kv-tokens" in why
    assert sglang_live.fits_message(needed, 143771 * 2**20) is None
    smaller = sglang_live.memory_needed(
        argparse.Namespace(model_dir=None, shape="llama-3.1-8b", kv_tokens=4096), 131072
    )
    assert smaller < needed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kv-tokens", "-5"], "argument --kv-tokens: must be positive, got '-5'"),
        (["--mem", "1.5"], "argument --mem: must be in (0, 1], got '1.5'"),
    ],
)
def test_a_bad_pool_or_memory_fraction_is_a_one_line_error(
    extra: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["sglang_live.py", "--out", "/tmp/x", "--slice", "s.csv", *extra]
    )
    with pytest.raises(SystemExit) as exc:
        sglang_live.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"sglang_live.py: error: {message}"


def test_runs_go_in_the_order_given_and_a_repeated_kind_gets_its_own_label() -> None:
    assert sglang_live.run_labels(["static", "fluidtoken", "fluidtoken", "static"]) == [
        ("static", "static"),
        ("fluidtoken", "fluidtoken"),
        ("fluidtoken", "fluidtoken-2"),
        ("static", "static-2"),
    ]
    args = sglang_live.parser().parse_args(
        ["--out", "o", "--slice", "s", "--runs", "fluidpd", "static"]
    )
    assert args.runs == ["fluidpd", "static"]
