"""The gpu engine serves a real model directory: greedy output across a real prefill/decode
split (beta = 0, 0.5, 1; KV through the shm transport) equals ``transformers``'
``generate(do_sample=False)`` on the same checkpoint token for token, for prompts with emoji
and CJK text tokenized by the model's own tokenizer; penalties match ``transformers``' own;
seeded sampling is the same on any split and in any batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fluidpd.api.sampling import SamplingParams

from .pd import PD, Job, run

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Emoji: 😀 🚀 🔥 ✨ and then 👩‍💻 wrote code",
    "東京は日本の首都です。我们正在测试一个大型语言模型。",
    "Mixed: the model said 你好 and then 😀 before writing résumé in code: print('héllo 🌍')",
]
NEW = 12
BETAS = (0.0, 0.5, 1.0)


def encode(model_dir: Path, text: str) -> list[int]:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return list(tok.encode(text).ids)


def hf_generate(model_dir: Path, prompts: list[list[int]], **gen: Any) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # NEW tokens, never stopped by an EOS id
    config = transformers.GenerationConfig(
        max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0, **gen
    )
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.inference_mode():
            seq = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        out.append(seq[0, len(ids) :].tolist())
    return out


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=NEW, temperature=0.0, **kw)


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_greedy_across_the_split_equals_transformers_generate(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    prompts = [encode(model_dir, p) for p in PROMPTS]
    assert all(len(p) > 8 for p in prompts)
    want = hf_generate(model_dir, prompts)
    pd = PD.build(model_dir)
    try:
        for beta in BETAS:
            jobs = [
                Job(100 * i + int(10 * beta), ids, greedy(), beta) for i, ids in enumerate(prompts)
            ]
            got = run(pd, jobs, NEW)
            for job, ref in zip(jobs, want, strict=True):
                assert got[job.rid] == ref, (beta, job.ids)
        # One decode batch mixing all three splits (and their extends) changes nothing.
        mixed = [Job(1000 + i, ids, greedy(), BETAS[i % 3]) for i, ids in enumerate(prompts)]
        got = run(pd, mixed, NEW)
        assert [got[j.rid] for j in mixed] == want
    finally:
        pd.close()


def test_repetition_penalty_equals_transformers(tiny_llama_dir: Path) -> None:
    # Prompts whose unpenalised greedy output repeats a token (so the penalty changes it).
    texts = ["1 2 3 4 5 6 7 8 9 10", "def fibonacci(n):\n    a, b = 0, 1", PROMPTS[2]]
    prompts = [encode(tiny_llama_dir, p) for p in texts]
    want = hf_generate(tiny_llama_dir, prompts, repetition_penalty=2.0)
    plain = hf_generate(tiny_llama_dir, prompts)
    assert all(w != p for w, p in zip(want, plain, strict=True))  # the penalty matters
    pd = PD.build(tiny_llama_dir)
    try:
        for beta in (0.0, 1.0):
            jobs = [Job(i + int(10 * beta), ids, greedy(repetition_penalty=2.0), beta)
                    for i, ids in enumerate(prompts)]  # fmt: skip
            got = run(pd, jobs, NEW)
            assert [got[j.rid] for j in jobs] == want, beta
    finally:
        pd.close()


def test_seeded_sampling_is_the_same_on_every_split(tiny_qwen3_dir: Path) -> None:
    prompts = [encode(tiny_qwen3_dir, p) for p in PROMPTS]
    seeded = SamplingParams(
        max_new_tokens=NEW, temperature=1.0, top_p=0.95, top_k=40, seed=1234,
        frequency_penalty=0.3, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    pd = PD.build(tiny_qwen3_dir)
    try:
        outs = []
        for beta in BETAS:
            jobs = [Job(10 * i + int(4 * beta), ids, seeded, beta) for i, ids in enumerate(prompts)]
            got = run(pd, jobs, NEW)
            outs.append([got[j.rid] for j in jobs])
        assert outs[0] == outs[1] == outs[2]
        alone = run(pd, [Job(77, prompts[2], seeded, 0.5)], NEW)[77]
        assert alone == outs[0][2]  # batch-mates do not matter either
        other = run(pd, [Job(78, prompts[2], seeded.model_copy(update={"seed": 99}), 0.5)], NEW)
        assert other[78] != alone
        greedy_out = run(pd, [Job(79, prompts[2], greedy(), 0.5)], NEW)[79]
        assert greedy_out != alone  # temperature 1 really samples
        tokens = pd.out[77]
        assert all(t.logprob is not None and t.logprob <= 0 and len(t.top) == 3 for t in tokens)
    finally:
        pd.close()
