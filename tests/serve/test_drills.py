"""Role switches under load and a killed worker, on real local deployments (small scale; the
full-size runs are ``fluidpd drill switches|kill`` with their JSON under results/)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fluidpd.drills.kill import kill_drill
from fluidpd.drills.switches import switch_drill


def test_switches_under_load_lose_no_request(stack_factory: Callable[..., Any]) -> None:
    stack = stack_factory("3P3D", "static")
    result = asyncio.run(
        switch_drill(stack.endpoint, stack.token, "llama-3.1-8b", n_switches=8, rps=6.0)
    )
    switches = result["switches"]
    assert len(switches) == 8
    assert all("error" not in s for s in switches), switches
    directions = {(s["from"], s["to"]) for s in switches}
    assert directions == {("prefill", "decode"), ("decode", "prefill")}
    assert {s["drain"] for s in switches if s["from"] == "decode"} == {"wait", "migrate"}
    req = result["requests"]
    assert req["sent"] > 30
    assert req["hung"] == 0
    # Switches re-pair queued work transparently: every request completes.
    assert req["completed"] == req["sent"], req


def test_killed_worker_is_dropped_and_nothing_hangs(stack_factory: Callable[..., Any]) -> None:
    stack = stack_factory("3P3D", "fluidpd")
    result = asyncio.run(
        kill_drill(
            stack.endpoint, "llama-3.1-8b", None, stack.pids(), rps=6.0, before_s=4.0,
            after_s=6.0, controller_log=stack.run_dir / "controller.log", token=stack.token,
        )
    )  # fmt: skip
    assert result["controller_switched_dead_worker"] is False
    assert result["router_dropped_after_s"] is not None
    req = result["requests"]
    assert req["hung"] == 0
    assert req["completed"] + req["failed_clearly"] == req["sent"]
    # Only requests already streaming from the dead worker may fail, with a clear message.
    for message in req["errors"]:
        assert result["worker"] in message and "lost" in message
    after = result["requests_started_after_drop"]
    assert after["sent"] > 0 and after["completed"] == after["sent"]
