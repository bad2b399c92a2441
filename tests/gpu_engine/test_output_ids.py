"""Seeded weights output only the served tokenizer's text ids.

Issue 15's live 2P2D runs (results/gpu/ipc-live-diag-2026-12-03): the 8B shape's seeded
weights picked ids over all 128,256 of Llama-3's, the embedded tokenizer renders 1,024 of them,
and clients time the first token by its text, so TTFT became the time to the first id below
1,024. The runner's mask must reach every way a token is chosen (greedy prefill, greedy decode,
the sampler and its log-probs), and the factory applies it to seeded weights only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from fluidpd.api.sampling import SamplingParams
from fluidpd.core.types import Role
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd.profiles import load_profile_file
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.gpu.factory import build_engine
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions
from fluidpd_sidecar.gpu.sampling import Row, Sampler

#: tiny-llama with Llama-3's vocabulary: the embedded tokenizer knows 1,024 of its ids.
BIG = replace(SHAPES["tiny-llama"], name="tiny-llama-128k", vocab=128256)
OPTS = RunnerOptions(device="cpu", dtype="float32", kv_tokens=2048, max_context=512, max_batch=4)
TEXT_IDS = tuple(TokenText.from_model_dir(resolve_model_dir(None)).text_ids())
PROFILE = Path(__file__).resolve().parents[2] / "results" / "drills" / "tiny-gpu-profile.yaml"
PROMPTS = [[300 + (7 * i) % 700 for i in range(n)] for n in (5, 40, 120)]


def generate(runner: ModelRunner, steps: int) -> list[list[int]]:
    """Greedy: token 0 from the prefill's logits, then ``steps`` batched decode steps."""
    outs = [[int(runner.prefill(rid, ids).argmax())] for rid, ids in enumerate(PROMPTS)]
    for _ in range(steps):
        tokens = runner.decode(list(range(len(PROMPTS))), [o[-1] for o in outs])
        for out, tok in zip(outs, tokens, strict=True):
            out.append(tok)
    return outs


def test_greedy_prefill_and_decode_stay_inside_the_text_ids() -> None:
    allowed = set(TEXT_IDS)
    free = generate(ModelRunner(BIG, OPTS), 12)
    # Unmasked, the noise picks among 128K ids: almost never one the tokenizer renders.
    assert sum(t in allowed for out in free for t in out) <= 3
    masked = generate(ModelRunner(BIG, replace(OPTS, output_ids=TEXT_IDS)), 12)
    assert all(t in allowed for out in masked for t in out)


def test_sampled_tokens_and_logprobs_stay_inside_too() -> None:
    runner = ModelRunner(BIG, replace(OPTS, output_ids=TEXT_IDS))
    logits = runner.prefill(0, PROMPTS[1])
    sampler = Sampler(BIG.vocab, torch.device("cpu"), seed=0)
    params = SamplingParams(max_new_tokens=8, temperature=2.0, top_logprobs=5)
    drawn = [sampler.sample(logits[None], [Row(0, params, 0)])[0] for _ in range(64)]
    assert {t.id for t in drawn} <= set(TEXT_IDS)
    assert {i for t in drawn for i, _ in t.top} <= set(TEXT_IDS)


def test_ids_outside_the_model_are_ignored_and_none_inside_is_refused() -> None:
    small = ModelRunner(SHAPES["tiny-llama"], replace(OPTS, output_ids=TEXT_IDS))  # 512 ids
    assert int(small.prefill(0, [5, 6, 7]).argmax()) in set(TEXT_IDS) & set(range(512))
    with pytest.raises(ValueError, match="output_ids"):
        ModelRunner(SHAPES["tiny-llama"], replace(OPTS, output_ids=(600, 700)))


def test_the_factory_masks_seeded_weights_only(tiny_llama_dir: Path) -> None:
    profile = load_profile_file(PROFILE)

    def engine(shape: str | None, model_dir: str | None, text_ids: tuple[int, ...] | None) -> Any:
        return build_engine(
            shape, profile, Role.PREFILL, model_dir=model_dir, device="cpu", dtype="float32",
            text_ids=text_ids,
        )  # fmt: skip

    assert engine("tiny-llama", None, TEXT_IDS).runner.opts.output_ids == TEXT_IDS
    assert engine("tiny-llama", None, None).runner.opts.output_ids is None
    assert engine(None, str(tiny_llama_dir), TEXT_IDS).runner.opts.output_ids is None
