"""The predictive switch rule live, over real HTTP between real processes (``fluidpd up``: the
router, the sim-engine sidecars and ``fluidpd controller``): the controller receives the
router's arrivals (its demand gauge), takes a forecast switch on a mismatched split and
declines one on a matched split, where eq. (22) alone would switch."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import aiohttp

from fluidpd.drills.load import OpenLoopLoad
from fluidpd.drills.stack import free_port_block

_SERIES = re.compile(r"^(fluidpd_controller_\w+)\{([^}]*)\} (\S+)$")


def _metrics(text: str) -> dict[tuple[str, str], float]:
    """(metric, kind or signal label) -> value, from the controller's exposition."""
    out = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m:
            label = re.search(r'(?:kind|signal)="([^"]*)"', m.group(2))
            out[(m.group(1), label.group(1) if label else "")] = float(m.group(3))
    return out


async def _drive(
    stack: Any, metrics_url: str, load: OpenLoopLoad, until: str, seconds: float
) -> dict[tuple[str, str], float]:
    """Runs the load until the controller counts an ``until`` event (or ``seconds`` pass);
    the controller's metrics at the end."""
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(seconds, stop))
    seen: dict[tuple[str, str], float] = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(int(seconds)):
            await asyncio.sleep(1.0)
            try:
                async with session.get(metrics_url) as resp:
                    seen = _metrics(await resp.text())
            except aiohttp.ClientConnectionError:
                continue  # the controller starts after the stack is up: still importing
            if seen.get(("fluidpd_controller_events_total", until), 0.0) >= 1:
                break
    stop.set()
    report = await task
    assert report.summary(120.0)["hung"] == 0
    return seen


def _start(stack_factory: Callable[..., Any], pd: str, *knobs: str) -> tuple[Any, str]:
    port = free_port_block(1)
    stack = stack_factory(
        pd, "fluidrole", "--n-persist", "2", "--controller-metrics-port", str(port), *knobs
    )
    return stack, f"http://127.0.0.1:{port}/metrics"


def _log(stack: Any) -> str:
    return str((stack.run_dir / "controller.log").read_text())


def test_mismatched_split_gets_the_forecast_switch(stack_factory: Callable[..., Any]) -> None:
    stack, metrics = _start(stack_factory, "1P3D", "--window", "2")
    # 12 req/s of 3-6K-token prompts: one prefill worker carries about a third of it.
    load = OpenLoopLoad(
        stack.endpoint, "llama-3.1-8b", rps=12.0, prompt_len=(3000, 6000), max_tokens=(2, 8)
    )
    seen = asyncio.run(_drive(stack, metrics, load, "switch-started", 40.0))
    stack.stop()
    log = _log(stack)
    assert "switch rule 'predictive': forecasts from the router's arrivals" in log
    assert seen[("fluidpd_controller_demand", "samples")] >= 20
    assert 3000 <= seen[("fluidpd_controller_demand", "prompt")] <= 6000
    assert seen[("fluidpd_controller_events_total", "switch-started")] >= 1, log[-3000:]
    started = [line for line in log.splitlines() if "decode -> prefill" in line]
    assert started and "forecast {" in started[0], log[-3000:]


def test_matched_split_declines_the_switch_eq22_proposes(
    stack_factory: Callable[..., Any],
) -> None:
    # PPI threshold 0.001: eq. (22) proposes D->P whenever a prompt is in a prefill queue in
    # the 10 s window; two prefill workers carry 8 req/s of 1-2K-token prompts at half their
    # SLO capacity (the forecast's prefill ratio about 0.4).
    stack, metrics = _start(stack_factory, "2P2D", "--ppi-low", "0", "--ppi-high", "0.001")
    load = OpenLoopLoad(
        stack.endpoint, "llama-3.1-8b", rps=8.0, prompt_len=(1000, 2000), max_tokens=(2, 8)
    )
    seen = asyncio.run(_drive(stack, metrics, load, "switch-declined", 40.0))
    stack.stop()
    log = _log(stack)
    assert seen[("fluidpd_controller_demand", "samples")] >= 20
    assert seen[("fluidpd_controller_events_total", "switch-declined")] >= 1, log[-3000:]
    assert seen[("fluidpd_controller_events_total", "switch-started")] == 0, log[-3000:]
    assert "switch declined by the forecast" in log
