"""Drain ``migrate`` with real KV on the gpu engine (tiny shapes, CPU): an active request's KV
(prompt and generated tokens) and decode state leave one decode engine through the shm
transport and it decodes on on another; its output equals the same request never migrated,
token for token (greedy, and seeded sampling with penalties)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fluidpd.api.sampling import SamplingParams
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.types import Role
from fluidpd_sidecar.arena import TransferError
from fluidpd_sidecar.engine import KVRegion
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.transfer_shm import ShmTransfer

from .pd import PD, Job, engine, run

NEW = 24
SAMPLED = SamplingParams(max_new_tokens=NEW, temperature=0.8, top_p=0.9, seed=7,
                         repetition_penalty=1.3, presence_penalty=0.5)  # fmt: skip


def _jobs() -> list[Job]:
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    return [
        Job(1, [(5 * i + 3) % 500 for i in range(40)], greedy),
        Job(2, [(7 * i + 11) % 500 for i in range(75)], greedy, beta=0.5),
        Job(3, [(3 * i + 1) % 500 for i in range(33)], SAMPLED),
    ]


async def _migrated(pd: PD, job: Job, after: int, pull: bool = False) -> list[int]:
    """Decodes ``job`` on ``pd.dec`` until it has ``after`` tokens, moves it to a third engine
    (KV through shm, as the sidecar's ``_move`` does: pushed into the target's arena, or
    ``pull``: read in place from the source's staging slot) and finishes it there."""
    t3 = ShmTransfer(1 << 23)
    other = engine(SHAPES["tiny-llama"], None, Role.DECODE, t3)
    try:
        suffix = [r for r in [await pd.hand_off(job)] if r is not None]
        while len(pd.dec.outputs(job.rid, 0, NEW)) < after:
            await pd.dec.decode_step(DecodeBatch(1, 0, suffix, 0.0, 0.0))
            suffix = []
        made = pd.dec.outputs(job.rid, 0, NEW)
        pd.dec.detach(job.rid)
        # Detached: a step of the source engine no longer touches it.
        await pd.dec.decode_step(DecodeBatch(0, 0, [], 0.0, 0.0))
        assert pd.dec.outputs(job.rid, 0, NEW) == made
        region = await pd.dec.export_decode(job.rid, len(made))
        other.admit(job.rid, job.ids, job.params, [t.id for t in made])
        if pull:
            with t3.peer_view(pd.td.session, region.addr, region.nbytes) as view:
                await other.load_decode(job.rid, view)
            pd.dec.release(job.rid)
        else:
            dest = t3.reserve(region.nbytes)
            assert dest is not None
            await pd.td.send(region.addr, dest, region.nbytes)
            pd.dec.release(job.rid)
            other.import_decode(job.rid, t3.view(dest.addr, dest.nbytes))
        while len(other.outputs(job.rid, 0, NEW)) < NEW:
            await other.decode_step(DecodeBatch(1, 0, [], 0.0, 0.0))
        return [t.id for t in other.outputs(job.rid, 0, NEW)]
    finally:
        t3.close()


# One request at a time: CPU float32 GEMMs are not batch-invariant (~5e-7), and the random
# tiny weights have near-tied logits, so only equal batch compositions give comparable argmaxes.
@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
@pytest.mark.parametrize("after", [1, 2, 9, 23])
@pytest.mark.parametrize("index", [0, 1, 2], ids=["greedy", "greedy-stolen", "seeded"])
def test_migrated_output_equals_unmigrated(index: int, after: int, pull: bool) -> None:
    job = _jobs()[index]
    ref_pd = PD.build(None, SHAPES["tiny-llama"])
    try:
        reference = run(ref_pd, [job], NEW)[job.rid]
    finally:
        ref_pd.close()
    pd = PD.build(None, SHAPES["tiny-llama"])
    try:
        got = asyncio.run(_migrated(pd, job, after, pull))
    finally:
        pd.close()
    assert got == reference


def test_a_drains_exports_and_pulled_loads_run_as_one_engine_job_each() -> None:
    """Requests leaving together are exported in one job on the source and loaded in one job on
    the target (not one job per request queued between decode steps), and each arrives whole:
    the KV the target holds is the KV the source had."""
    jobs = [Job(10 + i, [(3 * i + 5 * k + 1) % 500 for k in range(30 + 7 * i)],
                SamplingParams(max_new_tokens=NEW, temperature=0.0)) for i in range(5)]  # fmt: skip
    pd = PD.build(None, SHAPES["tiny-llama"])
    t3 = ShmTransfer(1 << 23)
    other = engine(SHAPES["tiny-llama"], None, Role.DECODE, t3)

    async def go() -> None:
        for job in jobs:
            await pd.hand_off(job)
        for _ in range(3):
            await pd.dec.decode_step(DecodeBatch(len(jobs), 0, [], 0.0, 0.0))
        made = {j.rid: [t.id for t in pd.dec.outputs(j.rid, 0, NEW)] for j in jobs}
        before = {j.rid: pd.dec.runner.export(j.rid, len(j.ids) + 2).clone() for j in jobs}
        for job in jobs:
            pd.dec.detach(job.rid)
        regions = await asyncio.gather(
            *(pd.dec.export_decode(j.rid, len(made[j.rid])) for j in jobs)
        )
        assert (pd.dec._exports.jobs, pd.dec._exports.items) == (1, len(jobs))

        async def pull(job: Job, region: KVRegion) -> None:
            other.admit(job.rid, job.ids, job.params, made[job.rid])
            with t3.peer_view(pd.td.session, region.addr, region.nbytes) as view:
                await other.load_decode(job.rid, view)

        await asyncio.gather(*(pull(j, r) for j, r in zip(jobs, regions, strict=True)))
        assert (other._pulls.jobs, other._pulls.items) == (1, len(jobs))
        for job in jobs:
            got = other.runner.export(job.rid, len(job.ids) + 2)
            assert torch.equal(got, before[job.rid])

    try:
        asyncio.run(go())
    finally:
        t3.close()
        pd.close()


def test_a_pull_from_outside_the_peers_arena_is_refused() -> None:
    pd = PD.build(None, SHAPES["tiny-llama"])
    t3 = ShmTransfer(1 << 23)
    try:
        with pytest.raises(TransferError, match="outside"), \
                t3.peer_view(pd.td.session, pd.td.base + (1 << 23) - 8, 64):  # fmt: skip
            pass
    finally:
        t3.close()
        pd.close()


def test_import_refuses_kv_of_the_wrong_length() -> None:
    pd = PD.build(None, SHAPES["tiny-llama"])
    t3 = ShmTransfer(1 << 23)
    try:

        async def go() -> None:
            job = _jobs()[0]
            await pd.hand_off(job)
            for _ in range(3):
                await pd.dec.decode_step(DecodeBatch(1, 0, [], 0.0, 0.0))
            made = pd.dec.outputs(job.rid, 0, NEW)
            pd.dec.detach(job.rid)
            region = await pd.dec.export_decode(job.rid, len(made))
            other = engine(SHAPES["tiny-llama"], None, Role.DECODE, t3)
            # One output token fewer than the KV holds: refused, not decoded into garbage.
            other.admit(job.rid, job.ids, job.params, [t.id for t in made[:-1]])
            with pytest.raises(ValueError, match="tokens"):
                other.import_decode(job.rid, pd.td.view(region.addr, region.nbytes))
            with pytest.raises(ValueError, match="to move"):
                await pd.dec.export_decode(job.rid, len(made) + 5)

        asyncio.run(go())
    finally:
        t3.close()
        pd.close()
