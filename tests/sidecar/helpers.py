"""In-process sidecar services on the sim engine for protocol-level tests (no HTTP, no
subprocess): the scheduler loop runs on the test's event loop, so races can be staged."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from fluidpd.api.internal import DecodeHalf
from fluidpd.api.sampling import SamplingParams
from fluidpd.cli.drill_cmd import FAST_PROFILE
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO, Role
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd.profiles import load_profile_file
from fluidpd_sidecar.engine import SimEngine
from fluidpd_sidecar.service import SidecarConfig, SidecarService
from fluidpd_sidecar.transfer import SimTransfer


def fast_profile(tmp: Path) -> Profile:
    path = tmp / "fast.yaml"
    path.write_text(FAST_PROFILE)
    return load_profile_file(str(path))


def sim_service(tmp: Path, worker: str, role: Role, **cfg: object) -> SidecarService:
    profile = fast_profile(tmp)
    model = resolve_model_dir(None)
    text = TokenText.from_model_dir(model)
    config = SidecarConfig(
        worker_id=worker,
        role=role,
        url=f"http://{worker}.invalid",
        profile=profile,
        slo=SLO(ttft=5.0, tpot=0.5),
        model=model,
        stream_interval_s=0.01,
        **cfg,  # type: ignore[arg-type]
    )
    engine = SimEngine(profile, text.text_ids())
    return SidecarService(config, engine, SimTransfer(profile.transfer_model()), text)


def decode_half(rid: int, max_new_tokens: int, prompt_len: int = 32) -> DecodeHalf:
    return DecodeHalf(
        rid=rid,
        prompt_ids=[7] * prompt_len,
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
        arrival=0.0,
        prefill_worker="p0",
        prefill_url="http://p0.invalid",
    )


async def until(cond: Callable[[], bool], what: str, polls: int = 1000) -> None:
    """Wait (at most ``polls`` turns of 10 ms) for ``cond``; ``what`` did not happen if not."""
    for _ in range(polls):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def events_of(svc: SidecarService, rid: int) -> list[dict[str, Any]]:
    """A decode half's whole event stream, as the router reads it."""
    half = svc.subscribe(svc.decode_half(rid))
    return [orjson.loads(line) async for line in svc.events(half)]


async def reserved_peer(on_reserved: Callable[[int], None]) -> tuple[web.AppRunner, str]:
    """A prefill peer that only takes reservations (``on_reserved(rid)`` for each): the decode
    half then waits for a hand-off that the test stages, or never sends. Returns the runner
    (``cleanup()`` it) and the peer's URL."""

    async def reserved(request: web.Request) -> web.Response:
        on_reserved(int(orjson.loads(await request.read())["rid"]))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/internal/reserved", reserved)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"
