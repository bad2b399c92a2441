"""The ``sim`` engine's timing model, once: how long a batch really takes on a simulated engine.

The discrete-event simulator (``fluidpd.sim.simulator``) and the live ``sim`` engine
(``fluidpd_sidecar.engine.SimEngine``) both run it, so a live and a simulated run of a workload
can be compared. A step takes the profile's predicted time (eq. 13 for decode, the prefill and
suffix predictors for prompts and stolen suffixes), times a drift factor (the engine is slower
than the profile says) and a mean-one log-normal noise factor drawn per step.

The random streams are the caller's (the core draws nothing of its own), so a simulator whose
runs are committed results keeps drawing the same numbers in the same order. Given a
``prompt_draw`` (the simulator's, keyed by its seed), a prompt's prefill noise is its own
instead: common random numbers, so that two policies replaying one workload differ by what they
do, not by the noise each one happened to draw (see ``StepTimes.prompt_factor``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from fluidpd.core.profile import Profile
from fluidpd.core.scheduler.decode import DecodeBatch
from fluidpd.core.scheduler.prefill import PrefillBatch


class NormalDraws(Protocol):
    """A source of normal draws (``random.Random`` is one)."""

    def gauss(self, mu: float, sigma: float) -> float: ...


class StepTimes:
    def __init__(
        self,
        profile: Profile,
        noise: float,
        drift: float,
        rng: NormalDraws,
        prompt_draw: Callable[[int, int], float] | None = None,
    ) -> None:
        #: Sigma of the mean-one log-normal noise on every step time (0: exact).
        self.noise = noise
        #: True time over predicted time (1: the profile is exact).
        self.drift = drift
        self._rng = rng
        #: Where set, a standard normal draw per (request id, dispatch): prefill noise is
        #: drawn per prompt (``prompt_factor``), not from ``rng``.
        self._prompt_draw = prompt_draw
        self._prefill = profile.prefill_predictor()
        self._suffix = profile.suffix_predictor()
        self._decode = profile.decode_predictor()

    def factor(self) -> float:
        """Drift times one draw of the noise (no draw when there is no noise)."""
        if self.noise <= 0:
            return self.drift
        return self._lognormal(self._rng.gauss(0.0, 1.0))

    def _lognormal(self, z: float) -> float:
        """Drift times the mean-one log-normal factor of the standard normal draw ``z``."""
        sigma = self.noise
        return self.drift * math.exp(sigma * z - 0.5 * sigma * sigma)

    def prompt_factor(self, rid: int, attempt: int) -> float:
        """Drift times the noise of one prompt's prefill, drawn from (request, dispatch)
        alone (``prompt_draw``): the same prompt takes the same time whatever ran before it
        (without a ``prompt_draw``, the next draw of the shared stream, ``factor``).

        Drawn from one stream, every step of any kind shifts the draws of every later
        prefill, so a policy that changed one decode step re-drew the noise of every prompt
        after it. Where prompts' prefill times sit at the TTFT target (10K-token prompts
        under a 1 s TTFT, 8B/A100, 0.95 s each), FluidToken stole from 2 of 800 requests
        and differed from the static split by -1.25 to +0.75 pp over four noise seeds,
        -0.12 pp without noise: the comparison measured the noise."""
        if self._prompt_draw is None:
            return self.factor()
        if self.noise <= 0:
            return self.drift
        return self._lognormal(self._prompt_draw(rid, attempt))

    def prefill(self, batch: PrefillBatch) -> float:
        """An empty prefix (the whole prompt stolen) takes no time and draws no noise."""
        if batch.prefix_tokens == 0:
            return 0.0
        req = batch.request
        return self._prefill.time(batch.prefix_tokens) * self.prompt_factor(req.rid, req.reassigned)

    def decode(self, batch: DecodeBatch) -> float:
        """One decode step: the batch's iteration plus the stolen suffixes prefilled with it."""
        t = self._decode.time(batch.batch, batch.context) if batch.batch else 0.0
        for req in batch.suffix:
            t += self._suffix.of_prompt(req.stolen, req.prompt_len)
        return t * self.factor()

    def duration(self, batch: PrefillBatch | DecodeBatch) -> float:
        return self.prefill(batch) if isinstance(batch, PrefillBatch) else self.decode(batch)

    def span(self, batch: DecodeBatch, rng: np.random.Generator) -> np.ndarray:
        """The true durations of a span's iterations (eq. 13 each, a noise draw each, drawn as
        one vector from ``rng``: the simulator keeps a stream of its own for spans)."""
        steps = self._decode.iteration_times(batch.batch, batch.context, batch.iterations)
        sigma = self.noise
        if sigma <= 0:
            return steps * self.drift
        draws = rng.normal(0.0, sigma, size=batch.iterations)
        return steps * (self.drift * np.exp(draws - 0.5 * sigma * sigma))
