"""The FluidRole controller against real sidecars: prefill pressure makes it move a decode
worker to prefill, in place, through POST /role."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from fluidpd.controller.loop import FluidRoleController
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.drills.load import OpenLoopLoad


async def _drive(stack: Any) -> FluidRoleController:
    cfg = FluidRoleConfig(n_persist=2, window_s=2.0, cooldown_s=60.0)
    # Long prompts at a rate one prefill worker cannot sustain: the queue's PPI climbs.
    load = OpenLoopLoad(
        stack.endpoint, "llama-3.1-8b", rps=12.0, prompt_len=(3000, 6000), max_tokens=(2, 8)
    )
    stop = asyncio.Event()
    load_task = asyncio.create_task(load.run(30.0, stop))
    async with aiohttp.ClientSession() as session:

        async def source() -> dict[str, str]:
            return dict(stack.workers)

        controller = FluidRoleController(source, cfg, session, stack.token)
        for _ in range(25):
            await controller.step()
            if any(e.kind == "switch-finished" for e in controller.events):
                break
            await asyncio.sleep(1.0)
    stop.set()
    report = await load_task
    assert report.summary(120.0)["hung"] == 0
    return controller


def test_controller_moves_a_decode_worker_to_prefill(stack_factory: Callable[..., Any]) -> None:
    stack = stack_factory("1P3D", "static")
    controller = asyncio.run(_drive(stack))
    kinds = [e.kind for e in controller.events]
    assert "switch-started" in kinds and "switch-finished" in kinds, kinds
    started = next(e for e in controller.events if e.kind == "switch-started")
    assert (started.detail["from"], started.detail["to"]) == ("decode", "prefill")
    report = controller.reports[started.worker]
    assert report["role"] == "prefill" and report["state"] == "active"
