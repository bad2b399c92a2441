"""The gpu engine driven the way the sidecar drives it: prefill on one engine, KV through the
shm transport, import and decode on another; the tokens equal one-engine greedy generation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.types import Request, Role
from fluidpd_sidecar.engine import kv_stamp
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.gpu.engine import GpuEngine, prompt_ids
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions
from fluidpd_sidecar.transfer_shm import ShmTransfer

OPTS = RunnerOptions(device="cpu", dtype="float32", kv_tokens=2048, max_context=512, max_batch=8)


def reference(shape: str, rid: int, prompt_len: int, new: int) -> list[int]:
    runner = ModelRunner(SHAPES[shape], OPTS)
    ids = prompt_ids(rid, 0, prompt_len, runner.cfg.vocab)
    out = [int(runner.prefill(rid, ids).argmax())]
    while len(out) < new:
        out += runner.decode([rid], [out[-1]])
    return out


def engines(shape: str) -> tuple[GpuEngine, ShmTransfer, GpuEngine, ShmTransfer]:
    tp, td = ShmTransfer(1 << 22), ShmTransfer(1 << 22)
    pre = GpuEngine(ModelRunner(SHAPES[shape], OPTS), Role.PREFILL, staging=tp)
    dec = GpuEngine(ModelRunner(SHAPES[shape], OPTS), Role.DECODE, staging=td)
    return pre, tp, dec, td


async def serve(shape: str, requests: list[tuple[int, int, int, int]]) -> dict[int, list[int]]:
    """requests: (rid, prompt_len, stolen, max_new); the decode loop mimics DecodeSide."""
    pre, tp, dec, td = engines(shape)
    suffix: list[Request] = []
    for rid, plen, stolen, _ in requests:
        dest = td.reserve(dec.kv_wire_bytes(plen))
        assert dest is not None
        req = Request(rid, 0.0, plen, 8)
        p = plen - stolen
        await pre.prefill(PrefillBatch(req, p, 0.0, 0.0), None)
        region = pre.export_kv(rid, p)
        assert region is not None
        await tp.send(region.addr, dest, region.nbytes)
        pre.release(rid)
        view = td.view(dest.addr, dest.nbytes)
        assert bytes(view[:8]) == kv_stamp(rid)
        dec.import_kv(rid, plen, p, view)
        if stolen:
            req.stolen = stolen
            suffix.append(req)
    out: dict[int, list[int]] = {}
    active = len([r for r in requests if not r[2]])
    steps = max(r[3] for r in requests) + 1
    for _ in range(steps):
        await dec.decode_step(DecodeBatch(active, 0, suffix, 0.0, 0.0))
        active += len(suffix)
        suffix = []
    for rid, _, _, new in requests:
        out[rid] = dec.token_ids(rid, 0, new)
    tp.close()
    td.close()
    return out


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_split_handoff_generates_what_one_engine_generates(shape: str) -> None:
    reqs = [(11, 40, 0, 6), (12, 33, 10, 5), (13, 50, 45, 6), (14, 17, 17, 4)]
    got = asyncio.run(serve(shape, reqs))
    for rid, plen, _, new in reqs:
        assert got[rid] == reference(shape, rid, plen, new), rid


def test_released_request_leaves_the_batch_and_frees_pages() -> None:
    async def go() -> tuple[int, int]:
        pre, tp, dec, td = engines("tiny-llama")
        free0 = dec.runner.cache.free_pages
        dest = td.reserve(dec.kv_wire_bytes(20))
        assert dest is not None
        await pre.prefill(PrefillBatch(Request(5, 0.0, 20, 4), 20, 0.0, 0.0), None)
        region = pre.export_kv(5, 20)
        assert region is not None
        await tp.send(region.addr, dest, region.nbytes)
        dec.import_kv(5, 20, 20, td.view(dest.addr, dest.nbytes))
        await dec.decode_step(DecodeBatch(1, 20, [], 0.0, 0.0))
        dec.release(5)
        await dec.decode_step(DecodeBatch(0, 0, [], 0.0, 0.0))
        return free0, dec.runner.cache.free_pages

    before, after = asyncio.run(go())
    assert before == after


def test_import_rejects_kv_of_the_wrong_shape() -> None:
    _, tp, dec, _ = engines("tiny-llama")
    region = tp.source_buffer(4096)
    assert region is not None
    view = tp.view(region.addr, 4096)
    view[:] = bytes(4096)
    with pytest.raises(ValueError, match="expected"):
        dec.import_kv(9, 30, 30, view)


def test_role_switch_keeps_weights_in_place() -> None:
    pre, _, _, _ = engines("tiny-qwen3")
    before = pre.runner.weights.pointers()
    asyncio.run(pre.switch_role(Role.DECODE))
    asyncio.run(pre.switch_role(Role.PREFILL))
    assert pre.runner.weights.pointers() == before
    assert [s["weights_unmoved"] for s in pre.stats.switches] == [True, True]
    assert torch.equal(
        pre.runner.weights.embed, ModelRunner(SHAPES["tiny-qwen3"], OPTS).weights.embed
    )
