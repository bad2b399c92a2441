"""The gpu engine's batched sampler against straightforward references and ``transformers``'
logits processors: each stage per row, the seeded draw's distribution and reproducibility,
logprobs."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch

from fluidpd.api.sampling import MAX_TOP_LOGPROBS, SamplingParams
from fluidpd_sidecar.gpu.sampling import (
    Row,
    Sampler,
    apply_min_p,
    apply_penalties,
    apply_top_k,
    apply_top_p,
    mix32,
    row_keys,
    seeded_uniforms,
)

lp = pytest.importorskip("transformers.generation.logits_process")

CPU = torch.device("cpu")


def P(**kw: Any) -> SamplingParams:  # noqa: N802 - reads like the parameters it builds
    return SamplingParams(max_new_tokens=16, **kw)


GREEDY = P(temperature=0.0)


def logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3


def test_penalties_match_hf_repetition_and_the_openai_formula() -> None:
    x = logits(3)
    prompts = [[1, 2, 3], [7, 7, 8], []]
    generated = [[3, 4, 4, 4], [], [9, 9, 10]]
    rep, freq, pres = [1.3, 1.0, 0.8], [0.5, 0.0, 1.5], [0.25, 0.0, -0.5]
    counts = torch.zeros(3, 50, dtype=torch.int32)
    seen = torch.zeros(3, 50, dtype=torch.bool)
    for i in range(3):
        for t in generated[i]:
            counts[i, t] += 1
        seen[i, prompts[i] + generated[i]] = True
    got = apply_penalties(
        x, counts, seen, torch.tensor(freq), torch.tensor(pres), torch.tensor(rep)
    )
    for i in range(3):
        ids = prompts[i] + generated[i]
        want = x[i : i + 1].clone()
        if ids:
            want = lp.RepetitionPenaltyLogitsProcessor(rep[i])(torch.tensor([ids]), want)
        want = want[0]
        for t, c in Counter(generated[i]).items():  # OpenAI: generated tokens only
            want[t] -= freq[i] * c + pres[i]
        assert torch.allclose(got[i], want, atol=1e-6), i


@pytest.mark.parametrize("k", [[1, 5, 0], [3, 50, 1000]])
def test_top_k_per_row_matches_hf(k: list[int]) -> None:
    x = logits(3)
    x[0, :4] = 2.5  # ties at the k-th value stay
    got = apply_top_k(x, torch.tensor(k))
    for i, ki in enumerate(k):
        want = x[i : i + 1] if ki <= 0 else lp.TopKLogitsWarper(ki)(None, x[i : i + 1].clone())
        assert torch.equal(got[i], want[0]), i


def test_top_p_per_row_matches_hf() -> None:
    x = logits(4)
    ps = [0.1, 0.5, 0.95, 1.0]
    got = apply_top_p(x, torch.tensor(ps))
    for i, p in enumerate(ps):
        want = x[i : i + 1] if p >= 1 else lp.TopPLogitsWarper(p)(None, x[i : i + 1].clone())
        assert torch.equal(got[i], want[0]), i
    assert torch.isfinite(got[0]).sum() >= 1


def test_min_p_per_row_matches_hf() -> None:
    x = logits(3)
    ms = [0.0, 0.05, 0.6]
    got = apply_min_p(x, torch.tensor(ms))
    for i, m in enumerate(ms):
        want = x[i : i + 1] if m == 0 else lp.MinPLogitsWarper(m)(None, x[i : i + 1].clone())
        assert torch.equal(got[i], want[0]), i


def _lowbias32(x: int) -> int:
    """The reference finaliser in plain Python integers (wrapping 32-bit arithmetic)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_is_lowbias32_without_overflow() -> None:
    xs = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    got = mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_lowbias32(x) for x in xs]


def test_seeded_uniforms_are_uniform_and_depend_on_seed_and_position() -> None:
    vocab = 4096
    tok = mix32(torch.arange(vocab, dtype=torch.int64))
    keys = row_keys(torch.tensor([1, 1, 2, -5, 2**62]), torch.tensor([0, 1, 0, 0, 7]))
    u = seeded_uniforms(keys, tok)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    rows = [tuple(r) for r in u.tolist()]
    assert len(set(rows)) == 5  # (seed, position) pairs all differ
    again = seeded_uniforms(row_keys(torch.tensor([2]), torch.tensor([0])), tok)
    assert torch.equal(again[0], u[2])


def test_seeded_draws_follow_the_softmax() -> None:
    """Output positions 0..N-1 of one seed: token frequencies match softmax(logits / T)."""
    sampler = Sampler(8, CPU)
    x = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -1.0, -3.0, 0.2])
    params = P(temperature=0.7, seed=1234)
    n = 20000
    rows = [Row(1, params, k) for k in range(n)]
    tokens = [s.id for s in sampler.sample(x.expand(n, 8), rows)]
    freq = torch.bincount(torch.tensor(tokens), minlength=8).float() / n
    want = (x / 0.7).softmax(-1)
    assert float((freq - want).abs().max()) < 0.012, (freq, want)


def test_filters_restrict_the_draw() -> None:
    sampler = Sampler(50, CPU)
    x = logits(1)[0]
    top3 = set(x.topk(3).indices.tolist())
    rows = [Row(1, P(top_k=3, seed=9), k) for k in range(300)]
    drawn = {s.id for s in sampler.sample(x.expand(300, 50), rows)}
    assert drawn <= top3 and len(drawn) > 1
    rows = [Row(1, P(top_p=1e-6, seed=9), k) for k in range(50)]
    assert {s.id for s in sampler.sample(x.expand(50, 50), rows)} == {int(x.argmax())}


def test_a_seeded_row_does_not_depend_on_its_batch() -> None:
    x = logits(4)
    a = P(temperature=1.1, top_p=0.9, seed=42)
    alone = Sampler(50, CPU).sample(x[2:3], [Row(7, a, 5)])[0].id
    rows = [Row(1, P(temperature=0.9), 3), Row(2, GREEDY, 0), Row(7, a, 5), Row(3, P(seed=1), 5)]
    in_batch = Sampler(50, CPU, seed=3).sample(x, rows)[2].id
    assert alone == in_batch
    seq = [Sampler(50, CPU).sample(x[2:3], [Row(7, a, k)])[0].id for k in range(40)]
    seq2 = [Sampler(50, CPU).sample(x[2:3], [Row(8, a, k)])[0].id for k in range(40)]
    other = [Sampler(50, CPU).sample(x[2:3], [Row(7, a.model_copy(update={"seed": 43}), k)])[0].id
             for k in range(40)]  # fmt: skip
    assert seq == seq2 and seq != other


def test_unseeded_rows_use_the_engine_generator() -> None:
    x = logits(1).expand(64, 50)
    rows = [Row(1, P(), k) for k in range(64)]
    one = [s.id for s in Sampler(50, CPU, seed=5).sample(x, rows)]
    two = [s.id for s in Sampler(50, CPU, seed=5).sample(x, rows)]
    three = [s.id for s in Sampler(50, CPU, seed=6).sample(x, rows)]
    assert one == two and one != three


def test_greedy_rows_take_the_penalised_argmax_and_state_follows_the_tokens() -> None:
    sampler = Sampler(50, CPU)
    x = logits(1)[0]
    top2 = x.topk(2).indices.tolist()
    x[top2[0]] = x[top2[1]] + 1.0  # the best leads by 1: a presence penalty of 2 flips it
    best = top2[0]
    p = P(temperature=0.0, presence_penalty=2.0)
    sampler.add(1, [], p)
    first = sampler.sample(x[None], [Row(1, p, 0)])[0].id
    second = sampler.sample(x[None], [Row(1, p, 1)])[0].id
    assert first == best and second == top2[1]  # the penalty now applies to `best`
    sampler.drop(1)
    assert float(x[best]) > 0  # divided by 10, the best logit loses its lead
    rep = P(temperature=0.0, repetition_penalty=10.0)
    sampler.add(2, [best], rep)
    assert sampler.sample(x[None], [Row(2, rep, 0)])[0].id != best
    assert sampler.sample(x[None], [Row(3, P(temperature=0.0), 0)])[0].id == best


def test_logprobs_are_the_raw_distribution() -> None:
    """``log_softmax`` of the logits before penalties, temperature and truncation (vLLM's
    ``raw_logprobs``, as ``fluidpd.api.sampling`` specifies for every engine)."""
    sampler = Sampler(50, CPU)
    x = logits(2)
    rows = [
        Row(1, P(temperature=0.5, top_k=2, seed=3, logprobs=True, top_logprobs=5), 0),
        Row(2, P(temperature=0.0, repetition_penalty=1.2, top_logprobs=MAX_TOP_LOGPROBS), 0),
    ]
    sampler.add(2, [0, 1, 2], rows[1].params)
    out = sampler.sample(x, rows)
    for i in range(2):
        ref = x[i].log_softmax(-1)
        assert out[i].logprob is not None
        assert math.isclose(out[i].logprob, float(ref[out[i].id]), abs_tol=1e-5)
    assert [t for t, _ in out[0].top] == x[0].log_softmax(-1).topk(5).indices.tolist()
    assert out[0].id in x[0].topk(2).indices.tolist()
    assert len(out[1].top) == MAX_TOP_LOGPROBS
    plain = sampler.sample(x, [Row(1, GREEDY, 0), Row(2, P(seed=1), 0)])
    assert all(s.logprob is None and s.top == () for s in plain)
