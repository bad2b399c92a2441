"""The router's abort after a prefill half that ended badly races the prefill's hand-off (found
by ``fluidpd drill chaos``): a prefill worker killed, or whose hand-off call timed out, after its
KV reached the decode worker made the router abort a decode half that could finish; when its
first token reached the router before the abort landed, the request failed with
``decode worker wN: cancelled prefill half ...``. An ``unless_started`` abort leaves a decode
half that has its KV alone, and still cancels one that does not.

The decode sidecar runs in process on the sim engine; its prefill peer is a stand-in over real
HTTP that takes the reservation (what the test stages is the hand-off's timing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from fluidpd.api.internal import Abort, DecodeHalf, Handoff
from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.core.types import Role
from fluidpd_sidecar.service import SidecarService
from tests.sidecar.helpers import reserved_peer, sim_service

PROMPT = 32


def _half(rid: int, prefill_url: str) -> DecodeHalf:
    return DecodeHalf(
        rid=rid, prompt_ids=[7] * PROMPT, sampling=SamplingParams(max_new_tokens=6),
        arrival=0.0, prefill_worker="p0", prefill_url=prefill_url,
    )  # fmt: skip


async def _events(svc: SidecarService, rid: int) -> list[dict[str, object]]:
    half = svc.decode_half(rid)
    half.subscribed = True  # the decode call's own stream, as the router reads it
    return [orjson.loads(line) async for line in svc.events(half)]


def test_an_abort_unless_started_spares_a_decode_half_with_its_kv(tmp_path: Path) -> None:
    async def go() -> None:
        reserved = {1: asyncio.Event(), 2: asyncio.Event(), 3: asyncio.Event()}
        runner, peer = await reserved_peer(lambda rid: reserved[rid].set())
        svc = sim_service(tmp_path, "d0", Role.DECODE)
        await svc.start()
        try:
            for rid in reserved:
                svc.accept_decode(_half(rid, peer))
            streams = {rid: asyncio.ensure_future(_events(svc, rid)) for rid in reserved}
            for event in reserved.values():
                await asyncio.wait_for(event.wait(), 10)
            # 1 and 3: the prefill's hand-off got here; 2: it never will.
            for rid in (1, 3):
                svc.handoff_done(
                    Handoff(rid=rid, prefix_tokens=PROMPT, nbytes=0, first=SampledToken(9))
                )
            why = "prefill half unreachable"
            svc.abort(Abort(rid=1, reason=why, unless_started=True))
            svc.abort(Abort(rid=2, reason=why, unless_started=True))
            svc.abort(Abort(rid=3, reason="client went away"))  # unconditional: still cancels
            got = {rid: await asyncio.wait_for(s, 10) for rid, s in streams.items()}
        finally:
            await svc.stop()
            await runner.cleanup()
        kinds = {rid: [e["event"] for e in events] for rid, events in got.items()}
        assert kinds[1][-1] == "done", kinds[1]
        assert sum(len(e["ids"]) for e in got[1] if e["event"] == "token") == 6  # type: ignore[arg-type]
        assert kinds[2] == ["cancelled"]
        assert kinds[3][-1] == "cancelled"

    asyncio.run(go())
