"""The engine interface every backend implements (``sim`` here, ``gpu`` in ``gpu/``, ``sglang``).

What the scheduler needs from an engine, after the design brief: learn a request's prompt ids
and sampling parameters, run a prefill batch (the prefix of one prompt), run a decode iteration
(the running batch plus any stolen-suffix extends), hand out the generated tokens, export and
import a request's KV for the P/D hand-off and for drain ``migrate``, free a request's KV, and
flip role in place. Engines own their weights and KV pool; the scheduler decides, the engine
computes, the sidecar stops requests (``fluidpd_sidecar.stopping``) and detokenizes.

The life of a request on an engine (every call names it by ``rid``):

prefill worker
    ``admit`` (prompt ids, sampling) -> ``prefill(batch)`` computes ``ids[:p]`` and, when
    ``p == len(ids)``, samples output token 0 -> ``first_token`` reads it (it travels to the
    decode worker in the ``Handoff``) -> ``export_kv`` -> ``release``.
decode worker
    ``admit`` -> ``import_kv`` (the prefix KV, and token 0 when the prefill worker sampled it)
    -> ``decode_step`` batches: a request with a stolen suffix runs ``ids[p:]`` as an extend in
    the step the scheduler puts it in (``batch.suffix``) and samples token 0 there; from the
    next step on it is in the running batch and gets one token per step -> ``outputs`` reads
    the tokens -> ``release`` (finished, stopped early, cancelled or migrated away).

Which requests are in a step's running batch is the scheduler's ``DecodeSide`` bookkeeping;
an engine mirrors it (a request whose token 0 is known joins the step after it became known;
a released request leaves at once) rather than being told, so the batch object stays small.
Output position ``k`` of a request is sampled with its ``SamplingParams`` (see
``fluidpd.api.sampling`` for the exact semantics, penalties included) and, when seeded, from
randomness that depends only on ``(seed, k)``, so which worker sampled it does not matter.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.core.profile import Profile
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.step_times import StepTimes
from fluidpd.core.types import Role
from fluidpd_sidecar.device_view import DeviceView

#: A transport's bytes as the engines see them: host memory, or a GPU arena (``cuda-ipc``).
KVBytes = memoryview | DeviceView


@dataclass(frozen=True, slots=True)
class KVRegion:
    """Where a request's KV lives in an engine's host-visible memory (for real transfers)."""

    addr: int
    nbytes: int


class KVStaging(Protocol):
    """A transport's registered memory that an engine stages outgoing KV in (host memory, or
    device memory for ``cuda-ipc``)."""

    def source_buffer(self, nbytes: int) -> KVRegion | None: ...

    def release_source(self, region: KVRegion) -> None: ...

    def view(self, addr: int, nbytes: int) -> KVBytes: ...


def kv_stamp(rid: int) -> bytes:
    """The first bytes a ``sim`` engine writes into a request's staged KV, so the receiving
    side can check that real bytes of the right request arrived."""
    return rid.to_bytes(8, "little")


class Engine(Protocol):
    """What the sidecar calls; every method but the two coroutines returns at once.

    ``migrates_kv`` (optional attribute, default True): False makes the sidecar refuse to
    adopt a migrated request (its KV would not arrive).
    """

    name: str

    def admit(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        output_ids: Sequence[int] = (),
    ) -> None:
        """A half of ``rid`` was accepted here: its whole prompt and how to sample it. Called
        once, before any other call naming ``rid``, on the prefill and on the decode worker.
        ``output_ids``: tokens already generated elsewhere (a request migrating in), which
        penalties count and which the engine continues after."""
        ...

    async def prefill(self, batch: PrefillBatch) -> float:
        """Compute the KV of ``prompt_ids[:batch.prefix_tokens]`` of ``batch.request``; when that
        is the whole prompt, also sample output token 0 (for ``first_token``). Returns the
        measured seconds."""
        ...

    def first_token(self, rid: int) -> SampledToken | None:
        """Prefill side, after ``prefill``: token 0 if the whole prompt was computed, else None."""
        ...

    async def decode_step(self, batch: DecodeBatch) -> float:
        """One decode iteration: one token for each request of the running batch, and the
        extend pass of each stolen suffix in ``batch.suffix`` (``prompt_ids[p:]`` on the
        imported prefix KV, sampling its token 0). Returns the measured seconds."""
        ...

    def outputs(self, rid: int, start: int, stop: int) -> list[SampledToken]:
        """Output tokens ``[start, stop)`` of a request (sampled by earlier steps, or token 0
        from ``import_kv``), with log-probabilities when the request asked for them."""
        ...

    def export_kv(self, rid: int, tokens: int) -> KVRegion | None:
        """The KV of the first ``tokens`` prompt positions, ready to send (None: no bytes)."""
        ...

    def kv_wire_bytes(self, tokens: int) -> int:
        """Bytes a hand-off of ``tokens`` prefix positions takes (what the decode side reserves)."""
        ...

    def import_kv(
        self, rid: int, prefix_tokens: int, view: KVBytes | None, first: SampledToken | None
    ) -> None:
        """Decode side: a request's prefix KV arrived in ``view`` (None: the transport moves
        no bytes), with token 0 when the prefill worker computed the whole prompt; called
        before the scheduler learns of the hand-off. Raises ValueError if the KV is not
        what was announced (the request then fails, the worker goes on)."""
        ...

    def take_loaded(self) -> list[int]:
        """Requests whose imported KV the engine has loaded since the last call: their
        ``import_kv`` views are no longer read, so the transport's room can be reused."""
        ...

    def release(self, rid: int) -> None:
        """Free whatever the engine holds for a request (idempotent; a request that stopped
        early leaves the running batch here, before the next step)."""
        ...

    async def switch_role(self, role: Role) -> float:
        """Flip the engine into ``role`` once drained (e.g. capture decode CUDA graphs)."""
        ...


@dataclass(slots=True)
class _SimRequest:
    key: int
    top: int
    logprobs: bool
    first: SampledToken | None = None


class SimEngine:
    """Steps take the profile's predicted time (times drift and mean-one log-normal noise),
    slept on the event loop; tokens are a deterministic function of the request and position.

    The same timing model as the discrete-event simulator (``fluidpd.core.step_times``), so live
    and simulated runs of a workload can be compared. Tokens are drawn from ``vocab`` (a
    tokenizer's ordinary ids: no special token, so no EOS, and a trace's output lengths are
    kept) by a hash of the prompt (greedy: the same prompt always gives the same output, as with
    a real model), of the prompt and seed (seeded sampling) or of the request id (unseeded
    sampling), and the position; the same detokenization and stopping then run as with a real
    engine. Its log-probabilities are synthetic (hash-drawn, the chosen token the most likely),
    so that their plumbing and formats are exercised, not a model.
    """

    name = "sim"

    def __init__(
        self,
        profile: Profile,
        vocab: Sequence[int],
        noise: float = 0.0,
        drift: float = 1.0,
        seed: int = 0,
        staging: KVStaging | None = None,
    ) -> None:
        if not vocab:
            raise ValueError("the sim engine needs a non-empty vocabulary to draw tokens from")
        self.profile = profile
        self._vocab = np.asarray(vocab, dtype=np.int64)
        #: With a byte-moving transport, prefix KV is staged (stamped dummy bytes) in its
        #: registered memory so that the hand-off moves as many real bytes as a GPU would.
        self._staging = staging
        self._staged: dict[int, KVRegion] = {}
        self._loaded: list[int] = []
        self._requests: dict[int, _SimRequest] = {}
        self._times = StepTimes(profile, noise, drift, random.Random(seed))

    async def _sleep(self, seconds: float) -> float:
        t0 = time.perf_counter()
        if seconds > 0:
            await asyncio.sleep(seconds)
        return time.perf_counter() - t0

    def admit(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        output_ids: Sequence[int] = (),
    ) -> None:
        if sampling.greedy or sampling.seed is not None:
            key = zlib.crc32(np.asarray(prompt_ids, dtype=np.int64).tobytes())
            if not sampling.greedy:
                key = zlib.crc32(int(sampling.seed or 0).to_bytes(8, "little"), key)
        else:
            key = zlib.crc32(rid.to_bytes(8, "little"))
        self._requests[rid] = _SimRequest(key, sampling.top_logprobs, sampling.wants_logprobs)

    def _token(self, req: _SimRequest, k: int) -> SampledToken:
        h = zlib.crc32(k.to_bytes(4, "little"), req.key)
        tid = int(self._vocab[h % len(self._vocab)])
        if not req.logprobs:
            return SampledToken(tid)
        lp = -((h >> 8) % 1000) / 500.0
        top = [(tid, lp)]
        for j in range(1, req.top):
            alt = int(self._vocab[zlib.crc32(j.to_bytes(4, "little"), h) % len(self._vocab)])
            if all(alt != t for t, _ in top):
                top.append((alt, lp - 0.5 * j))
        return SampledToken(tid, lp, tuple(top[: req.top]))

    async def prefill(self, batch: PrefillBatch) -> float:
        req = self._requests.get(batch.request.rid)
        if req is not None and batch.prefix_tokens == batch.request.prompt_len:
            req.first = self._token(req, 0)
        if batch.prefix_tokens == 0:
            return 0.0
        return await self._sleep(self._times.prefill(batch))

    def first_token(self, rid: int) -> SampledToken | None:
        req = self._requests.get(rid)
        return req.first if req is not None else None

    async def decode_step(self, batch: DecodeBatch) -> float:
        return await self._sleep(self._times.decode(batch))

    def outputs(self, rid: int, start: int, stop: int) -> list[SampledToken]:
        req = self._requests.get(rid)
        if req is None:
            return []
        out = [self._token(req, k) for k in range(start, stop)]
        if start == 0 and out and req.first is not None:
            out[0] = req.first  # the prefill worker's token 0, as it arrived
        return out

    def export_kv(self, rid: int, tokens: int) -> KVRegion | None:
        if self._staging is None or tokens == 0:
            return None
        nbytes = tokens * self.profile.kv.bytes_per_token
        region = self._staging.source_buffer(nbytes)
        if region is None:
            raise MemoryError(f"no room to stage {nbytes} B of KV for request {rid}")
        stamp = kv_stamp(rid)
        self._staging.view(region.addr, len(stamp))[:] = stamp
        self._staged[rid] = region
        return region

    def kv_wire_bytes(self, tokens: int) -> int:
        return tokens * self.profile.kv.bytes_per_token

    def import_kv(
        self, rid: int, prefix_tokens: int, view: KVBytes | None, first: SampledToken | None
    ) -> None:
        # The stamp check in the service is all a sim engine can verify; it keeps no view.
        req = self._requests.get(rid)
        if req is not None and first is not None:
            req.first = first
        self._loaded.append(rid)

    def take_loaded(self) -> list[int]:
        loaded, self._loaded = self._loaded, []
        return loaded

    def release(self, rid: int) -> None:
        self._requests.pop(rid, None)
        region = self._staged.pop(rid, None)
        if region is not None and self._staging is not None:
            self._staging.release_source(region)

    async def switch_role(self, role: Role) -> float:
        ms = (
            self.profile.switch.to_decode_ms
            if role is Role.DECODE
            else self.profile.switch.to_prefill_ms
        )
        return await self._sleep(ms * 1e-3)
