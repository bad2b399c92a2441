"""The gpu engine driven the way the sidecar drives it: prefill on one engine, KV through the
shm transport, import and decode on another; the tokens equal one-engine greedy generation,
and a request released mid-batch (an early stop) frees its KV and batch slot at once."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.types import Role
from fluidpd_sidecar.gpu import wire
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.gpu.profiler import bench_ids
from fluidpd_sidecar.gpu.runner import ModelRunner

from .pd import PD, Job, options, run

OPTS = options(None)


def reference(shape: str, ids: list[int], new: int) -> list[int]:
    runner = ModelRunner(SHAPES[shape], OPTS)
    out = [int(runner.prefill(1, ids).argmax())]
    while len(out) < new:
        out += runner.decode([1], [out[-1]])
    return out


def greedy(new: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=new, temperature=0.0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_split_handoff_generates_what_one_engine_generates(shape: str) -> None:
    vocab = SHAPES[shape].vocab
    # (rid, prompt length, stolen tokens, new tokens)
    reqs = [(11, 40, 0, 6), (12, 33, 10, 5), (13, 50, 45, 6), (14, 17, 17, 4)]
    jobs = [Job(rid, bench_ids(n, vocab, rid), greedy(new), stolen / n)
            for rid, n, stolen, new in reqs]  # fmt: skip
    assert [len(j.ids) - j.prefix for j in jobs] == [r[2] for r in reqs]
    pd = PD.build(None, SHAPES[shape])
    try:
        got = run(pd, jobs, 6)
    finally:
        pd.close()
    for job, (_, _, _, new) in zip(jobs, reqs, strict=True):
        assert got[job.rid][:new] == reference(shape, job.ids, new), job.rid


def test_a_release_mid_step_frees_kv_and_slot_and_spares_the_others() -> None:
    """Three requests decode together; one is released while a step computes on it (the
    sidecar's early stop races the engine's thread this way). The step finishes, the others'
    tokens are those they get alone, and every page and penalty slot comes back."""
    cfg = SHAPES["tiny-llama"]
    prompts = [bench_ids(30 + 7 * i, cfg.vocab, i) for i in range(3)]
    params = greedy(10, presence_penalty=0.5)
    alone = {}
    for i, ids in enumerate(prompts):
        pd = PD.build(None, cfg)
        alone[i] = run(pd, [Job(i, ids, params, 0.5)], 10)[i]
        pd.close()

    async def go() -> tuple[PD, dict[int, list[int]], int]:
        pd = PD.build(None, cfg)
        dec = pd.dec
        free0 = dec.runner.cache.free_pages
        suffix = [await pd.hand_off(Job(i, ids, params, 0.5)) for i, ids in enumerate(prompts)]
        await dec.decode_step(DecodeBatch(0, 0, [r for r in suffix if r], 0.0, 0.0))
        for _ in range(3):
            await dec.decode_step(DecodeBatch(3, 0, [], 0.0, 0.0))
        step = asyncio.ensure_future(dec.decode_step(DecodeBatch(3, 0, [], 0.0, 0.0)))
        await asyncio.sleep(0)  # the step is on the engine thread now
        dec.release(1)
        await step
        assert 1 not in dec._running and not dec.outputs(1, 0, 10)
        while len(dec.outputs(0, 0, 10)) < 10 or len(dec.outputs(2, 0, 10)) < 10:
            await dec.decode_step(DecodeBatch(2, 0, [], 0.0, 0.0))
        got = {r: [t.id for t in dec.outputs(r, 0, 10)] for r in (0, 2)}
        assert sorted(dec.sampler.penalties.slots) == [0, 2]
        dec.release(0)
        dec.release(2)
        await dec.decode_step(DecodeBatch(0, 0, [], 0.0, 0.0))
        return pd, got, free0

    pd, got, free0 = asyncio.run(go())
    try:
        assert got == {0: alone[0], 2: alone[2]}
        assert pd.dec.runner.cache.free_pages == free0
        assert not pd.dec.runner.cache.tables and not pd.dec.sampler.penalties.slots
    finally:
        pd.close()


def test_admit_refuses_ids_outside_the_vocabulary() -> None:
    pd = PD.build(None, SHAPES["tiny-llama"])
    try:
        with pytest.raises(ValueError, match="token id 512 outside the vocabulary"):
            pd.dec.admit(1, [1, 2, 512], greedy(3))
        with pytest.raises(ValueError, match="not admitted"):
            pd.dec.import_kv(2, 0, None, None)
    finally:
        pd.close()


def test_import_rejects_kv_of_the_wrong_shape_and_a_missing_first_token() -> None:
    cfg = SHAPES["tiny-llama"]
    pd = PD.build(None, cfg)
    try:
        n = pd.dec.kv_wire_bytes(30)
        region = pd.tp.source_buffer(n)
        assert region is not None
        view = pd.tp.view(region.addr, n)
        view[:] = bytes(n)
        pd.dec.admit(9, list(range(1, 31)), greedy(4))
        with pytest.raises(ValueError, match="expected"):
            pd.dec.import_kv(9, 30, view, None)
        with pytest.raises(ValueError, match="30 KV tokens announced, no bytes"):
            pd.dec.import_kv(9, 30, None, None)
        kv = torch.zeros(cfg.layers, 2, 30, cfg.kv_heads, cfg.head_dim)
        wire.write(view, 9, 5, kv)
        with pytest.raises(ValueError, match="whole prompt handed off without a first token"):
            pd.dec.import_kv(9, 30, view, None)
        with pytest.raises(ValueError, match="first token 6 announced, 5 in the KV"):
            pd.dec.import_kv(9, 30, view, SampledToken(6))
    finally:
        pd.close()


def test_role_switch_keeps_weights_in_place() -> None:
    pd = PD.build(None, SHAPES["tiny-qwen3"])
    pre = pd.pre
    try:
        before = pre.runner.weights.pointers()
        asyncio.run(pre.switch_role(Role.DECODE))
        asyncio.run(pre.switch_role(Role.PREFILL))
        assert pre.runner.weights.pointers() == before
        assert [s["weights_unmoved"] for s in pre.stats.switches] == [True, True]
        assert torch.equal(
            pre.runner.weights.embed, ModelRunner(SHAPES["tiny-qwen3"], OPTS).weights.embed
        )
    finally:
        pd.close()
