"""The live ``sim`` engine runs the simulator's timing model (``fluidpd.core.step_times``)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.step_times import StepTimes
from fluidpd.core.types import Request
from fluidpd_sidecar.engine import SimEngine
from tests.sidecar.helpers import fast_profile


def test_the_live_sim_engine_takes_the_models_time(tmp_path: Path) -> None:
    """SimEngine sleeps what the shared model says for the same seed (measured: at least that)."""
    profile = fast_profile(tmp_path)
    engine = SimEngine(profile, [5, 6, 7], noise=0.2, drift=1.3, seed=11)
    model = StepTimes(profile, 0.2, 1.3, random.Random(11))
    batch = PrefillBatch(Request(1, 0.0, 512, 8), 256, 0.0, 0.0)
    slept = asyncio.run(engine.prefill(batch))
    assert slept >= model.prefill(batch)
