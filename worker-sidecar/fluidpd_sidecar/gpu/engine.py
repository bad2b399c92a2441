"""``GpuEngine``: the ``Engine`` interface over the model runner, driven by the sidecar.

All GPU work runs on one worker thread, in the order the scheduler asks for it, so the event
loop keeps serving HTTP while a step runs (torch releases the GIL in kernels). Bookkeeping the
scheduler relies on (which requests join the next decode step, which left) is done on the
event-loop thread when a call is made, and the thread only executes a plan; cache pages and
sampler state of released requests are freed on the thread at the start and at the end of
every job, never under a running step, so a release at any moment (an early stop while a step
runs) frees the request's KV without racing the step that may still be computing on it.

Batch membership mirrors the scheduler's ``DecodeSide``: a request whose whole prompt was
prefilled joins the step after its hand-off (its token 0 came with the hand-off); a request
with a stolen suffix runs its extend in the step the scheduler puts it in, samples its token 0
there, and joins the following step. The engine computes on exactly the ids it was given in
``admit``: the prefill worker on ``ids[:p]``, the decode worker's extend on ``ids[p:]``.
Tokens are chosen by ``sampling.Sampler``; an all-greedy step without penalties or logprobs
takes the argmax the decode graph already computed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.types import Role
from fluidpd_sidecar.engine import KVBytes, KVRegion, KVStaging
from fluidpd_sidecar.gpu import wire
from fluidpd_sidecar.gpu.batched import Batched
from fluidpd_sidecar.gpu.runner import ModelRunner, pin_host_memory
from fluidpd_sidecar.gpu.sampling import Row, Sampler, is_plain_greedy

log = logging.getLogger("fluidpd.gpu")

#: How often a prefill waiting for staging room looks again (hand-offs take milliseconds).
_STAGING_POLL_S = 0.002


@dataclass(slots=True)
class _Request:
    ids: list[int]
    params: SamplingParams
    #: Output tokens so far (decode side; token 0 on the prefill side once sampled there).
    out: list[SampledToken] = field(default_factory=list)


@dataclass(slots=True)
class _Import:
    rid: int
    view: KVBytes | None
    tokens: int
    #: For the sampler's state: the prompt, its parameters and the tokens already out.
    ids: list[int]
    params: SamplingParams
    generated: list[int]


@dataclass(slots=True)
class EngineStats:
    prefills: int = 0
    decode_steps: int = 0
    extends: int = 0
    sampled_steps: int = 0
    staged_bytes: int = 0
    stage_s: float = 0.0
    imported_bytes: int = 0
    import_s: float = 0.0
    switches: list[dict[str, Any]] = field(default_factory=list)


class GpuEngine:
    name = "gpu"
    #: A migrate drain moves an active request's KV (prompt and generated tokens) with the KV
    #: transport: ``detach`` / ``export_decode`` on the source, ``import_decode`` on the peer.
    migrates_kv = True

    def __init__(
        self,
        runner: ModelRunner,
        role: Role,
        staging: KVStaging | None = None,
        sampler_seed: int | None = None,
    ) -> None:
        self.runner = runner
        self.cfg = runner.cfg
        self._staging = staging
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpu-engine")
        #: Unseeded requests draw from this sampler's generator (seeded ones from a hash).
        self.sampler = Sampler(runner.cfg.vocab, runner.device, sampler_seed)
        self._requests: dict[int, _Request] = {}
        self._staged: dict[int, KVRegion] = {}
        self._imports: list[_Import] = []
        self._loaded: list[int] = []
        self._running: list[int] = []
        self._joining: list[int] = []
        self._to_free: list[int] = []
        self.stats = EngineStats()
        #: A migrate drain's exports (source) and pulled loads (target), batched per job.
        self._exports: Batched[tuple[int, int, KVRegion], None] = Batched(
            self._pool, self._export_many
        )
        self._pulls: Batched[_Import, float] = Batched(self._pool, self._pull_many)
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
        if getattr(self._staging, "on_device", False):
            return  # a GPU arena (cuda-ipc): nothing to pin
        if not pin_host_memory(base, size):
            log.warning("cudaHostRegister of the KV arena failed; copies are pageable")

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _free_released(self, busy: frozenset[int] = frozenset()) -> None:
        """Worker thread: free what released requests held, except those the job about to run
        computes on (released after it was planned: they are freed when it ends). The event
        loop appends while this runs, so entries are popped one by one."""
        kept = []
        while self._to_free:
            rid = self._to_free.pop()
            if rid in busy:
                kept.append(rid)
                continue
            self.runner.release(rid)
            self.sampler.drop(rid)
        self._to_free += kept

    def _request(self, rid: int) -> _Request:
        req = self._requests.get(rid)
        if req is None:
            raise ValueError(f"request {rid} is not admitted on this engine")
        return req

    # -- Engine interface -------------------------------------------------------------------------
    def admit(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        output_ids: Sequence[int] = (),
    ) -> None:
        ids = [int(t) for t in prompt_ids]
        vocab = self.cfg.vocab
        bad = next((t for t in [*ids, *output_ids] if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(
                f"request {rid}: token id {bad} outside the vocabulary (0..{vocab - 1})"
            )
        self._requests[rid] = _Request(ids, sampling, [SampledToken(int(t)) for t in output_ids])

    @property
    def vocab_size(self) -> int:
        """Token ids this engine samples and takes (the model's; the served tokenizer may have
        fewer)."""
        return self.cfg.vocab

    def kv_wire_bytes(self, tokens: int) -> int:
        return wire.wire_bytes(self.cfg, tokens, self.runner.weights.embed.element_size())

    async def prefill(self, batch: PrefillBatch) -> float:
        rid = batch.request.rid
        req = self._request(rid)
        p = batch.prefix_tokens
        params = req.params if p == len(req.ids) else None
        region = None
        if self._staging is not None:
            region = await self._stage(self.kv_wire_bytes(p))
            self._staged[rid] = region
        seconds, first = await self._run(self._prefill_job, rid, req.ids[:p], params, region)
        if first is not None:
            req.out = [first]
        self.stats.prefills += 1
        return float(seconds)

    async def _stage(self, nbytes: int) -> KVRegion:
        """Room in the arena for this prefill's KV. Earlier prefills' hand-offs are in flight
        and free their regions as they end, so a full arena is waited out (backpressure on the
        prefill queue), not an error. (The sidecar refuses to start with an arena that cannot
        hold a request at the context limit, so the room always comes.)"""
        assert self._staging is not None
        while (region := self._staging.source_buffer(nbytes)) is None:
            await asyncio.sleep(_STAGING_POLL_S)
        return region

    def _prefill_job(
        self, rid: int, ids: list[int], params: SamplingParams | None, region: KVRegion | None
    ) -> tuple[float, SampledToken | None]:
        """``params`` given: the prefix is the whole prompt, and token 0 is sampled here."""
        self._free_released(frozenset((rid,)))
        t0 = time.perf_counter()
        first = None
        if ids:
            logits = self.runner.prefill(rid, ids)
            if params is not None:
                self.sampler.add(rid, ids, params)
                first = self.sampler.sample(logits[None], [Row(rid, params, 0)])[0]
                self.sampler.drop(rid)  # the decode worker samples the rest
        self.runner.sync()
        seconds = time.perf_counter() - t0
        if region is not None and self._staging is not None:
            t1 = time.perf_counter()
            view = self._staging.view(region.addr, region.nbytes)
            kv = self.runner.export(rid, len(ids))
            n = wire.write(view, rid, -1 if first is None else first.id, kv)
            self.stats.staged_bytes += n
            self.stats.stage_s += time.perf_counter() - t1
        self._free_released()
        return seconds, first

    def first_token(self, rid: int) -> SampledToken | None:
        req = self._requests.get(rid)
        return req.out[0] if req is not None and req.out else None

    async def decode_step(self, batch: DecodeBatch) -> float:
        reqs = self._requests
        self._running += [r for r in self._joining if r in reqs]
        self._joining = []
        suffix = [
            (r.rid, r.prompt_len - r.stolen, reqs[r.rid].ids[r.prompt_len - r.stolen :])
            for r in batch.suffix
            if r.rid in reqs
        ]
        imports, self._imports = self._imports, []
        running = list(self._running)
        last = [reqs[r].out[-1].id for r in running]
        rows = [Row(rid, reqs[rid].params, 0) for rid, _, _ in suffix]
        rows += [Row(rid, reqs[rid].params, len(reqs[rid].out)) for rid in running]
        seconds, sampled = await self._run(self._decode_job, imports, suffix, running, last, rows)
        self._loaded += [imp.rid for imp in imports]
        for (rid, _, _), tok in zip(suffix, sampled[: len(suffix)], strict=True):
            req = reqs.get(rid)
            if req is not None:  # not released while the step ran
                req.out = [tok]
                self._joining.append(rid)
        for rid, tok in zip(running, sampled[len(suffix) :], strict=True):
            req = reqs.get(rid)
            if req is not None:
                req.out.append(tok)
        if len(running) != batch.batch:
            log.debug("engine batch %d vs scheduler batch %d", len(running), batch.batch)
        self.stats.decode_steps += 1
        self.stats.extends += len(suffix)
        return float(seconds)

    def _decode_job(
        self,
        imports: list[_Import],
        suffix: list[tuple[int, int, list[int]]],
        running: list[int],
        last: list[int],
        rows: list[Row],
    ) -> tuple[float, list[SampledToken]]:
        self._free_released(
            frozenset([*running, *(r.rid for r in rows), *(i.rid for i in imports)])
        )
        self._load(imports)
        t0 = time.perf_counter()
        heads = [self.runner.prefill(rid, ids, start) for rid, start, ids in suffix]
        self.runner.step(running, last)
        if all(is_plain_greedy(r.params) for r in rows):
            tokens = torch.stack(heads).argmax(-1).tolist() if heads else []
            sampled = [SampledToken(int(t)) for t in tokens]
            sampled += [SampledToken(t) for t in self.runner.greedy(len(running))]
        else:
            parts = [torch.stack(heads)] if heads else []
            if running:
                parts.append(self.runner.logits(len(running)))
            sampled = self.sampler.sample(torch.cat(parts), rows)
            self.stats.sampled_steps += 1
        self.runner.sync()
        seconds = time.perf_counter() - t0
        self._free_released()
        return seconds, sampled

    def _load(self, imports: list[_Import]) -> None:
        for imp in imports:
            self.sampler.add(imp.rid, imp.ids, imp.params, imp.generated)
            if imp.view is None or imp.tokens == 0:
                self.runner.cache.ensure(imp.rid, 0)
                continue
            t0 = time.perf_counter()
            head = wire.read_header(imp.view)
            self.runner.load(imp.rid, wire.payload(imp.view, head, self.runner.dtype))
            self.stats.imported_bytes += self.kv_wire_bytes(head.tokens)
            self.stats.import_s += time.perf_counter() - t0

    def import_kv(
        self, rid: int, prefix_tokens: int, view: KVBytes | None, first: SampledToken | None
    ) -> None:
        """The prefix KV of ``rid`` arrived in ``view`` (loaded on the GPU before the next step)."""
        req = self._request(rid)
        if prefix_tokens > len(req.ids):
            raise ValueError(
                f"request {rid}: {prefix_tokens} KV tokens for a prompt of {len(req.ids)}"
            )
        if prefix_tokens and view is None:
            raise ValueError(f"request {rid}: {prefix_tokens} KV tokens announced, no bytes")
        header_first = -1
        if view is not None and prefix_tokens:
            head = wire.read_header(view)
            if head.tokens != prefix_tokens or head.layers != self.cfg.layers:
                raise ValueError(
                    f"request {rid}: KV of {head.tokens} tokens x {head.layers} layers arrived, "
                    f"{prefix_tokens} x {self.cfg.layers} expected"
                )
            header_first = head.first_token
        whole = prefix_tokens == len(req.ids)
        if whole:
            if first is None:
                raise ValueError(f"request {rid}: whole prompt handed off without a first token")
            if header_first >= 0 and header_first != first.id:
                raise ValueError(
                    f"request {rid}: first token {first.id} announced, {header_first} in the KV"
                )
            req.out = [first]
            self._joining.append(rid)
        generated = [t.id for t in req.out]
        self._imports.append(_Import(rid, view, prefix_tokens, req.ids, req.params, generated))

    def take_loaded(self) -> list[int]:
        loaded, self._loaded = self._loaded, []
        return loaded

    # -- migration (drain "migrate") ------------------------------------------------------------
    def detach(self, rid: int) -> None:
        """The request leaves this engine's batch now (it is moving away); its KV stays until
        ``export_decode`` has copied it and ``release`` frees it."""
        if rid in self._running:
            self._running.remove(rid)
        if rid in self._joining:
            self._joining.remove(rid)

    async def export_decode(self, rid: int, generated: int) -> KVRegion:
        """Stages the KV of the prompt and the first ``generated - 1`` output tokens (the last
        output token has no KV yet: the next step feeds it) in the transport's memory."""
        req = self._request(rid)
        if self._staging is None:
            raise ValueError("the gpu engine migrates KV only with a byte-moving transport")
        if not 1 <= generated <= len(req.out):
            raise ValueError(f"request {rid}: {generated} tokens to move, {len(req.out)} made")
        tokens = len(req.ids) + generated - 1
        region = await self._stage(self.kv_wire_bytes(tokens))
        self._staged[rid] = region  # ``release`` gives it back
        # One engine job for every export submitted until the thread gets to it.
        await self._exports.submit((rid, tokens, region))
        return region

    def _export_many(self, items: list[tuple[int, int, KVRegion]]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for rid, tokens, region in items:
            try:
                self._export_job(rid, tokens, region)
                out.append(None)
            except ValueError as exc:
                out.append(exc)
        return out

    def _export_job(self, rid: int, tokens: int, region: KVRegion) -> None:
        assert self._staging is not None
        have = self.runner.cache.lengths.get(rid, 0)
        if have < tokens:
            raise ValueError(f"request {rid}: {have} KV positions, {tokens} to move")
        t0 = time.perf_counter()
        kv = self.runner.export(rid, tokens)  # a prefix: positions past it are not moved
        self.stats.staged_bytes += wire.write(self._staging.view(region.addr, region.nbytes),
                                              rid, -1, kv)  # fmt: skip
        self.stats.stage_s += time.perf_counter() - t0

    def _migrated_import(self, rid: int, view: KVBytes) -> _Import:
        req = self._request(rid)
        tokens = len(req.ids) + len(req.out) - 1
        if not req.out:
            raise ValueError(f"request {rid}: migrated in without output tokens")
        head = wire.read_header(view)
        if head.tokens != tokens or head.layers != self.cfg.layers:
            raise ValueError(
                f"request {rid}: KV of {head.tokens} tokens x {head.layers} layers arrived, "
                f"{tokens} x {self.cfg.layers} expected"
            )
        generated = [t.id for t in req.out]
        return _Import(rid, view, tokens, req.ids, req.params, generated)

    def import_decode(self, rid: int, view: KVBytes) -> None:
        """A migrated request's KV arrived in ``view``: it is loaded before the next step and
        the request decodes on from its last output token (``admit`` gave the outputs)."""
        self._imports.append(self._migrated_import(rid, view))
        self._joining.append(rid)

    async def load_decode(self, rid: int, view: KVBytes) -> float:
        """Pull: a migrated request's KV in the source's staging slot (``view``, readable only
        until this returns) is loaded into this engine's pages now, batched with every other
        load submitted meanwhile into one job; the request joins the next step. Seconds the
        job's loads took."""
        imp = self._migrated_import(rid, view)
        seconds = await self._pulls.submit(imp)
        if rid in self._requests:  # not released while it loaded
            self._joining.append(rid)
        return seconds

    def _pull_many(self, imports: list[_Import]) -> list[float | BaseException]:
        self._free_released(frozenset(i.rid for i in imports))
        t0 = time.perf_counter()
        out: list[float | BaseException] = []
        for imp in imports:
            try:
                self._load([imp])
                out.append(0.0)
            except (ValueError, RuntimeError, MemoryError) as exc:
                out.append(exc)
        self.runner.sync()  # the source reuses its slot once we answer
        seconds = time.perf_counter() - t0
        self._free_released()
        return [r if isinstance(r, BaseException) else seconds for r in out]

    def outputs(self, rid: int, start: int, stop: int) -> list[SampledToken]:
        req = self._requests.get(rid)
        return req.out[start:stop] if req is not None else []

    def export_kv(self, rid: int, tokens: int) -> KVRegion | None:
        return self._staged.get(rid)

    def release(self, rid: int) -> None:
        region = self._staged.pop(rid, None)
        if region is not None and self._staging is not None:
            self._staging.release_source(region)
        self._requests.pop(rid, None)
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
