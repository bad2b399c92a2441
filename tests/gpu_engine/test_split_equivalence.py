"""FluidToken on real compute (CPU, tiny shapes): prefix on one process, KV hand-off through
the shm transport, suffix extend on another equals the unsplit prefill."""

from __future__ import annotations

import pytest

from fluidpd_sidecar.gpu.equivalence import BETAS, split_check


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_split_prefill_equals_unsplit_across_processes(shape: str) -> None:
    report = split_check(shape, device="cpu", dtype="float32", prompt_len=96)
    assert [r["beta"] for r in report["rows"]] == list(BETAS)
    for row in report["rows"]:
        assert row["stamp_ok"]
        assert row["prefix"] + row["suffix"] == 96
        assert row["max_rel_err"] < 1e-5, row
        assert row["same_token"], row


def test_split_prefill_over_mooncake_tcp() -> None:
    pytest.importorskip("mooncake.engine")
    report = split_check("tiny-llama", prompt_len=64, betas=(0.5,), transport="mooncake")
    row = report["rows"][0]
    assert report["transport"] == "mooncake"
    assert row["stamp_ok"] and row["same_token"] and row["max_rel_err"] < 1e-5
