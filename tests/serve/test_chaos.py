"""A short chaos drill on a real local deployment (the 10-minute run is ``fluidpd drill chaos``,
its JSON under results/drills/): sidecars, the router and the controller SIGKILLed and restarted
under load, and only the failures the drill can name."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fluidpd.drills.chaos import DECODE_LOST, ROUTER_CUT, chaos_drill
from fluidpd.drills.stack import free_port_block


def test_chaos_loses_only_what_a_kill_explains(stack_factory: Callable[..., Any]) -> None:
    port = free_port_block(1)
    stack = stack_factory(
        "2P2D", "fluidpd", "--controller-metrics-port", str(port), "--ready-timeout", "300"
    )
    result = asyncio.run(
        chaos_drill(
            stack.run_dir, stack.endpoint, stack.workers, stack.token, "llama-3.1-8b",
            duration_s=30.0, rps=3.0, gap_s=(0.5, 1.5), ready_timeout_s=240.0,
            controller_metrics=f"http://127.0.0.1:{port}/metrics", stream_share=0.3, seed=3,
        )
    )  # fmt: skip
    kills = result["kills"]
    # The first kills cover every kind of component; each returns to all-ready.
    assert {"prefill sidecar", "decode sidecar", "router", "controller"} <= set(kills["by_kind"])
    assert kills["not_ready_after"] == 0, result["each_kill"]
    assert result["final_not_ready"] == ""
    req = result["requests"]
    assert req["sent"] > 40 and req["streamed"] > 0
    assert req["hung"] == 0
    assert req["completed"] + req["failed"] == req["sent"]
    assert set(req["failed_by_cause"]) <= {DECODE_LOST, ROUTER_CUT}, req["unexplained_failures"]
    # Every retry the client made was while the router was down; those requests completed.
    assert req["unexplained_retries"] == {}
    assert req["client_retries"] > 0 and req["completed_after_client_retry"] > 0
    # Nothing a kill orphaned stays on a sidecar (reservations, queued halves, adopted copies).
    assert result["work_left_on_sidecars"] == {}
