"""``GpuEngine``: the ``Engine`` interface over the model runner, driven by the sidecar.

All GPU work runs on one worker thread, in the order the scheduler asks for it, so the event
loop keeps serving HTTP while a step runs (torch releases the GIL in kernels). Bookkeeping the
scheduler relies on (which requests join the next decode step, which left) is done on the
event-loop thread when a call is made, and the thread only executes a plan; cache pages of
released requests are freed on the thread before its next job, never under a running step.

Batch membership mirrors the scheduler's ``DecodeSide``: a request whose whole prompt was
prefilled joins the step after its hand-off (its first token came in the wire header); a
request with a stolen suffix runs its extend in the step the scheduler puts it in, samples
its first token there, and joins the following step. Prompt token ids: the sidecar protocol
carries prompt lengths, not ids, so both halves derive the same ids from (request id,
position) with ``prompt_ids``; any list given to ``prefill`` is used instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.types import Role
from fluidpd_sidecar.engine import KVRegion, KVStaging
from fluidpd_sidecar.gpu import wire
from fluidpd_sidecar.gpu.runner import ModelRunner, pin_host_memory

log = logging.getLogger("fluidpd.gpu")

#: How often a prefill waiting for staging room looks again (hand-offs take milliseconds).
_STAGING_POLL_S = 0.002


def prompt_ids(rid: int, start: int, stop: int, vocab: int) -> list[int]:
    """Deterministic stand-in prompt tokens (identical in every process)."""
    return [((rid * 2654435761) ^ (k * 2246822519 + 374761393)) % vocab for k in range(start, stop)]


@dataclass(slots=True)
class _Import:
    rid: int
    view: memoryview | None
    tokens: int


@dataclass(slots=True)
class EngineStats:
    prefills: int = 0
    decode_steps: int = 0
    extends: int = 0
    staged_bytes: int = 0
    stage_s: float = 0.0
    imported_bytes: int = 0
    import_s: float = 0.0
    switches: list[dict[str, Any]] = field(default_factory=list)


class GpuEngine:
    name = "gpu"
    #: A migrate drain moves no KV bytes yet (the sidecar's ``_move`` sends none), so this
    #: engine refuses adoption and a D->P drain waits for its requests instead.
    migrates_kv = False

    def __init__(self, runner: ModelRunner, role: Role, staging: KVStaging | None = None) -> None:
        self.runner = runner
        self.cfg = runner.cfg
        self._staging = staging
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpu-engine")
        self._out: dict[int, list[int]] = {}
        self._staged: dict[int, KVRegion] = {}
        self._imports: list[_Import] = []
        self._loaded: list[int] = []
        self._running: list[int] = []
        self._joining: list[int] = []
        self._to_free: list[int] = []
        self.stats = EngineStats()
        self.role = role
        self._pin_staging()
        if role is Role.DECODE:
            self.runner.capture()

    def _pin_staging(self) -> None:
        """Page-lock the transport's arena so GPU <-> arena copies are DMA (no bounce)."""
        base = getattr(self._staging, "base", None)
        size = getattr(self._staging, "arena_bytes", None)
        if not self.runner.on_cuda or base is None or size is None:
            return
        if not pin_host_memory(base, size):
            log.warning("cudaHostRegister of the KV arena failed; copies are pageable")

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _free_released(self) -> None:
        for rid in self._to_free:
            self.runner.release(rid)
        self._to_free.clear()

    # -- Engine interface -------------------------------------------------------------------------
    def kv_wire_bytes(self, tokens: int) -> int:
        return wire.wire_bytes(self.cfg, tokens, self.runner.weights.embed.element_size())

    async def prefill(self, batch: PrefillBatch, prompt_ids_: list[int] | None) -> float:
        req = batch.request
        p = batch.prefix_tokens
        ids = prompt_ids_[:p] if prompt_ids_ else prompt_ids(req.rid, 0, p, self.cfg.vocab)
        full = p == req.prompt_len
        region = None
        if self._staging is not None:
            region = await self._stage(self.kv_wire_bytes(p))
            self._staged[req.rid] = region
        seconds: float = await self._run(self._prefill_job, req.rid, ids, full, region)
        self.stats.prefills += 1
        return seconds

    async def _stage(self, nbytes: int) -> KVRegion:
        """Room in the arena for this prefill's KV. Earlier prefills' hand-offs are in flight
        and free their regions as they end, so a full arena is waited out (backpressure on the
        prefill queue), not an error. (The sidecar refuses to start with an arena that cannot
        hold a request at the context limit, so the room always comes.)"""
        assert self._staging is not None
        while (region := self._staging.source_buffer(nbytes)) is None:
            await asyncio.sleep(_STAGING_POLL_S)
        return region

    def _prefill_job(self, rid: int, ids: list[int], full: bool, region: KVRegion | None) -> float:
        self._free_released()
        t0 = time.perf_counter()
        first = -1
        if ids:
            logits = self.runner.prefill(rid, ids)
            if full:
                first = int(logits.argmax())
        self.runner.sync()
        seconds = time.perf_counter() - t0
        if region is not None and self._staging is not None:
            t1 = time.perf_counter()
            view = self._staging.view(region.addr, region.nbytes)
            kv = self.runner.export(rid, len(ids))
            n = wire.write(view, rid, first, kv)
            self.stats.staged_bytes += n
            self.stats.stage_s += time.perf_counter() - t1
        elif full:
            self._out[rid] = [first]
        return seconds

    async def decode_step(self, batch: DecodeBatch) -> float:
        self._running += [r for r in self._joining if r in self._out]
        self._joining = []
        suffix = [
            (r.rid, r.prompt_len - r.stolen, r.prompt_len)
            for r in batch.suffix
            if r.rid in self._out
        ]
        imports, self._imports = self._imports, []
        running = list(self._running)
        last = [self._out[r][-1] for r in running]
        seconds, firsts, tokens = await self._run(self._decode_job, imports, suffix, running, last)
        self._loaded += [imp.rid for imp in imports]
        for (rid, _, _), tok in zip(suffix, firsts, strict=True):
            if rid in self._out:
                self._out[rid] = [tok]
                self._joining.append(rid)
        for rid, tok in zip(running, tokens, strict=True):
            out = self._out.get(rid)
            if out is not None:
                out.append(tok)
        if len(running) != batch.batch:
            log.debug("engine batch %d vs scheduler batch %d", len(running), batch.batch)
        self.stats.decode_steps += 1
        self.stats.extends += len(suffix)
        return float(seconds)

    def _decode_job(
        self,
        imports: list[_Import],
        suffix: list[tuple[int, int, int]],
        running: list[int],
        last: list[int],
    ) -> tuple[float, list[int], list[int]]:
        self._free_released()
        self._load(imports)
        t0 = time.perf_counter()
        firsts = []
        for rid, start, stop in suffix:
            ids = prompt_ids(rid, start, stop, self.cfg.vocab)
            firsts.append(int(self.runner.prefill(rid, ids, start).argmax()))
        tokens = self.runner.decode(running, last)
        self.runner.sync()
        return time.perf_counter() - t0, firsts, tokens

    def _load(self, imports: list[_Import]) -> None:
        for imp in imports:
            if imp.view is None or imp.tokens == 0:
                self.runner.cache.ensure(imp.rid, 0)
                continue
            t0 = time.perf_counter()
            head = wire.read_header(imp.view)
            self.runner.load(imp.rid, wire.payload(imp.view, head, self.runner.dtype))
            self.stats.imported_bytes += self.kv_wire_bytes(head.tokens)
            self.stats.import_s += time.perf_counter() - t0

    def import_kv(
        self, rid: int, prompt_len: int, prefix_tokens: int, view: memoryview | None
    ) -> None:
        """The prefix KV of ``rid`` arrived in ``view`` (loaded on the GPU before the next step)."""
        if prefix_tokens and view is None:
            raise ValueError(f"request {rid}: {prefix_tokens} KV tokens announced, no bytes")
        first = -1
        if view is not None and prefix_tokens:
            head = wire.read_header(view)
            if head.tokens != prefix_tokens or head.layers != self.cfg.layers:
                raise ValueError(
                    f"request {rid}: KV of {head.tokens} tokens x {head.layers} layers arrived, "
                    f"{prefix_tokens} x {self.cfg.layers} expected"
                )
            first = head.first_token
        self._imports.append(_Import(rid, view, prefix_tokens))
        self._out[rid] = []
        if prefix_tokens == prompt_len:
            if first < 0:
                raise ValueError(f"request {rid}: whole prompt handed off without a first token")
            self._out[rid] = [first]
            self._joining.append(rid)

    def take_loaded(self) -> list[int]:
        loaded, self._loaded = self._loaded, []
        return loaded

    def token_ids(self, rid: int, start: int, stop: int) -> list[int]:
        out = self._out.get(rid, [])[start:stop]
        if len(out) < stop - start:  # e.g. a request adopted without KV (migrate drain)
            out = out + [0] * (stop - start - len(out))
        return out

    def export_kv(self, rid: int, tokens: int) -> KVRegion | None:
        return self._staged.get(rid)

    def release(self, rid: int) -> None:
        region = self._staged.pop(rid, None)
        if region is not None and self._staging is not None:
            self._staging.release_source(region)
        self._out.pop(rid, None)
        if rid in self._running:
            self._running.remove(rid)
        if rid in self._joining:
            self._joining.remove(rid)
        self._imports = [i for i in self._imports if i.rid != rid]
        self._to_free.append(rid)

    async def switch_role(self, role: Role) -> float:
        seconds: float = await self._run(self._switch_job, role)
        return seconds

    def _switch_job(self, role: Role) -> float:
        """In place: weights and KV pool stay; decode graphs are captured on first need."""
        t0 = time.perf_counter()
        before = self.runner.weights.pointers()
        self._free_released()
        capture = self.runner.capture() if role is Role.DECODE else 0.0
        self.runner.sync()
        seconds = time.perf_counter() - t0
        same = before == self.runner.weights.pointers()
        self.stats.switches.append(
            {"from": self.role.value, "to": role.value, "s": seconds, "capture_s": capture,
             "weights_unmoved": same}
        )  # fmt: skip
        self.role = role
        return seconds
