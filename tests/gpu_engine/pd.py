"""Two gpu engines driven the way two sidecars drive them: admit on both, prefill the prefix on
the prefill engine, KV through a real ``shm`` transport (one arena per engine, bytes copied
between them), import and decode on the decode engine, release when a request has its tokens.

The decode loop mirrors the scheduler's ``DecodeSide`` batch membership: a request whose whole
prompt was prefilled is in the running batch from the next step on; a stolen suffix runs as an
extend in the step after its hand-off and joins the batch in the one after that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.types import Request, Role
from fluidpd_sidecar.engine import kv_stamp
from fluidpd_sidecar.gpu.checkpoint import model_dir_config
from fluidpd_sidecar.gpu.config import ModelConfig
from fluidpd_sidecar.gpu.engine import GpuEngine
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions
from fluidpd_sidecar.transfer_shm import ShmTransfer


def options(model_dir: Path | None, dtype: str = "float32") -> RunnerOptions:
    return RunnerOptions(
        device="cpu", dtype=dtype, kv_tokens=4096, max_context=512, max_batch=8,
        model_dir=str(model_dir) if model_dir else None,
    )  # fmt: skip


def engine(cfg: ModelConfig, model_dir: Path | None, role: Role, staging: ShmTransfer) -> GpuEngine:
    return GpuEngine(ModelRunner(cfg, options(model_dir)), role, staging=staging, sampler_seed=0)


@dataclass
class Job:
    rid: int
    ids: list[int]
    params: SamplingParams
    #: Stealing ratio: the decode engine computes the last round(beta * L) prompt tokens.
    beta: float = 0.0

    @property
    def prefix(self) -> int:
        return round((1 - self.beta) * len(self.ids))


@dataclass
class PD:
    pre: GpuEngine
    dec: GpuEngine
    tp: ShmTransfer
    td: ShmTransfer
    #: Tokens of each request at the step it was released.
    out: dict[int, list[SampledToken]] = field(default_factory=dict)

    @classmethod
    def build(cls, model_dir: Path | None, cfg: ModelConfig | None = None) -> PD:
        cfg = cfg or model_dir_config(model_dir)  # type: ignore[arg-type]
        tp, td = ShmTransfer(1 << 23), ShmTransfer(1 << 23)
        pre = engine(cfg, model_dir, Role.PREFILL, tp)
        return cls(pre, engine(cfg, model_dir, Role.DECODE, td), tp, td)

    def close(self) -> None:
        self.tp.close()
        self.td.close()

    async def hand_off(self, job: Job) -> Request | None:
        """Admit on both, prefill the prefix, send its KV, import it; the stolen request
        (for the next step's ``suffix``) or None if the prefill engine computed it all."""
        n = len(job.ids)
        self.pre.admit(job.rid, job.ids, job.params)
        self.dec.admit(job.rid, job.ids, job.params)
        dest = self.td.reserve(self.dec.kv_wire_bytes(n))
        assert dest is not None
        req = Request(job.rid, 0.0, n, job.params.max_new_tokens)
        p = job.prefix
        await self.pre.prefill(PrefillBatch(req, p, 0.0, 0.0))
        first = self.pre.first_token(job.rid)
        assert (first is not None) == (p == n)
        region = self.pre.export_kv(job.rid, p)
        assert region is not None
        await self.tp.send(region.addr, dest, region.nbytes)
        self.pre.release(job.rid)
        view = self.td.view(dest.addr, dest.nbytes)
        assert bytes(view[:8]) == kv_stamp(job.rid)
        self.dec.import_kv(job.rid, p, view, first)
        if p == n:
            return None
        req.stolen = n - p
        return req

    async def generate(self, jobs: list[Job], new_tokens: int) -> dict[int, list[SampledToken]]:
        """Every job's first ``new_tokens`` output tokens (all handed off, then decoded in one
        batch; each request is released the step it has its tokens, as an early stop is)."""
        suffix = [r for r in [await self.hand_off(j) for j in jobs] if r is not None]
        live = {j.rid for j in jobs}
        active = len(jobs) - len(suffix)
        while live:
            await self.dec.decode_step(DecodeBatch(active, 0, suffix, 0.0, 0.0))
            active += len(suffix)
            suffix = []
            for rid in sorted(live):
                got = self.dec.outputs(rid, 0, new_tokens)
                if len(got) == new_tokens:
                    self.out[rid] = got
                    self.dec.release(rid)
                    live.discard(rid)
                    active -= 1
        return {j.rid: self.out[j.rid] for j in jobs}


def run(pd: PD, jobs: list[Job], new_tokens: int) -> dict[int, list[int]]:
    got = asyncio.run(pd.generate(jobs, new_tokens))
    return {rid: [t.id for t in toks] for rid, toks in got.items()}
