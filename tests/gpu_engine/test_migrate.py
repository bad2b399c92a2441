"""Drain ``migrate`` with real KV on the gpu engine (tiny shapes, CPU): an active request's KV
(prompt and generated tokens) and decode state leave one decode engine through the shm
transport and it decodes on on another; its output equals the same request never migrated,
token for token (greedy, and seeded sampling with penalties)."""

from __future__ import annotations

import asyncio

import pytest

from fluidpd.api.sampling import SamplingParams
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.types import Role
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


async def _migrated(pd: PD, job: Job, after: int) -> list[int]:
    """Decodes ``job`` on ``pd.dec`` until it has ``after`` tokens, moves it to a third engine
    (KV through shm, as the sidecar's ``_move`` does) and finishes it there."""
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
        dest = t3.reserve(region.nbytes)
        assert dest is not None
        await pd.td.send(region.addr, dest, region.nbytes)
        pd.dec.release(job.rid)
        other.admit(job.rid, job.ids, job.params, [t.id for t in made])
        other.import_decode(job.rid, t3.view(dest.addr, dest.nbytes))
        while len(other.outputs(job.rid, 0, NEW)) < NEW:
            await other.decode_step(DecodeBatch(1, 0, [], 0.0, 0.0))
        return [t.id for t in other.outputs(job.rid, 0, NEW)]
    finally:
        t3.close()


# One request at a time: CPU float32 GEMMs are not batch-invariant (~5e-7), and the random
# tiny weights have near-tied logits, so only equal batch compositions give comparable argmaxes.
@pytest.mark.parametrize("after", [1, 2, 9, 23])
@pytest.mark.parametrize("index", [0, 1, 2], ids=["greedy", "greedy-stolen", "seeded"])
def test_migrated_output_equals_unmigrated(index: int, after: int) -> None:
    job = _jobs()[index]
    ref_pd = PD.build(None, SHAPES["tiny-llama"])
    try:
        reference = run(ref_pd, [job], NEW)[job.rid]
    finally:
        ref_pd.close()
    pd = PD.build(None, SHAPES["tiny-llama"])
    try:
        got = asyncio.run(_migrated(pd, job, after))
    finally:
        pd.close()
    assert got == reference


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
