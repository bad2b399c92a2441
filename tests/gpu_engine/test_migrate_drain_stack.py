"""A live ``migrate`` drain on the gpu engine (``fluidpd up`` 1P2D, CPU, a tiny shape whose
vocabulary, 4,096 ids, is larger than the served tokenizer's 1,024, as the llama-3.1-8b shape's
is on the H200): decode worker w1 holds active requests, switches to prefill with drain
``migrate`` towards w2, and every request moves (issue #15: every adoption was refused with
HTTP 400 there and the drain fell back to waiting). w1's shm arena (1 MiB) is smaller than the
KV of the requests it moves, so their KV is staged and pulled in pieces."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
from pathlib import Path

from fluidpd.drills.stack import LocalStack
from fluidpd_sidecar.gpu.config import SHAPES

GPU = Path(__file__).resolve().parents[2] / "scripts" / "gpu"
sys.path.insert(0, str(GPU))

import migrate_drain  # noqa: E402

PROFILE = Path(__file__).resolve().parents[2] / "results" / "drills" / "tiny-gpu-profile.yaml"
# Outputs of 128 tokens: with 48, on a loaded CI machine (prefill of the 16 prompts serialised on
# w0) w1's first requests ended before its last ones arrived, and it switched with 4 active.
ACTIVE, PROMPT, NEW = 8, 384, 128


def test_a_migrate_drain_moves_every_active_request(tmp_path: Path) -> None:
    shape = tmp_path / "shape"
    shape.mkdir()
    hf = dataclasses.replace(SHAPES["tiny-llama"], vocab=4096).to_hf_config()
    hf["architectures"] = ["LlamaForCausalLM"]
    (shape / "config.json").write_text(json.dumps(hf))
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE.read_text().replace("context_limit: 4096", "context_limit: 1024"))
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 500) for _ in range(PROMPT)] for _ in range(2 * ACTIVE)]
    up = ["--engine", "gpu", "--engine-model", str(shape / "config.json"), "--device", "cpu",
          "--dtype", "float32", "--profile", str(profile), "--kv-transfer", "shm",
          "--kv-arena-mib", "1", "--ready-timeout", "170", "--log-level", "info"]  # fmt: skip
    with LocalStack(tmp_path / "up", "1P2D", "static", *up, token="t") as stack:
        got = asyncio.run(migrate_drain.phase(stack, "serving-path", prompts, NEW, ACTIVE))
        orphans = stack.stop()
    assert not orphans
    switch = got["switch"]
    phases = switch["phases"]
    assert switch["active_at_switch"] >= 6
    # Every request active on w1 at the switch moved (none was refused, none waited here) ...
    assert phases["moved"] == switch["active_at_switch"], phases
    assert (phases["refused"], phases["failed"], phases["finished_here"]) == (0, 0, 0)
    assert phases["pulled"] is True
    # ... through an arena smaller than their KV (512 B a token here).
    assert phases["kv_bytes"] > 1 << 20
    # and every request, moved or not, has all its tokens.
    assert [r.get("tokens") for r in got["results"]] == [NEW] * (2 * ACTIVE)
    for log in (tmp_path / "up").glob("w*.log"):
        assert "Traceback" not in log.read_text(), log
