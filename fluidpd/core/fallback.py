"""Capacity fallback: scale out only when FluidRole cannot help, scale back in after slack.

FluidRole moves capacity between phases; when both phases are pressured it can only report
``NEEDS_CAPACITY`` (§IV-C2). This module turns that advice into worker-count decisions for a
harness that owns the pod count (the operator): add one worker of the more pressured phase once
the advice has persisted ``scale_out_after_s``, and remove one worker of a phase that can spare
it once the whole deployment has been calm for ``scale_in_after_s`` (beyond the paper). It never
goes above ``max_workers`` nor below the worker count the user asked for, and it acts one worker
at a time: a harness reports ``settled=False`` while an added worker is not serving yet or a
removed one is still draining, and nothing new is decided until it settles.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    PoolPressure,
    Recommendation,
    decode_can_spare_one,
    prefill_can_spare_one,
)
from fluidpd.core.types import Role


class ScaleDirection(StrEnum):
    OUT = "out"
    IN = "in"


@dataclass(frozen=True, slots=True)
class FallbackConfig:
    enabled: bool = False
    max_workers: int = 16
    scale_out_after_s: float = 30.0
    scale_in_after_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_workers < 2:
            raise ValueError("max_workers must be at least 2")
        if self.scale_out_after_s < 0 or self.scale_in_after_s < 0:
            raise ValueError("scale-out and scale-in delays must be non-negative")


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    direction: ScaleDirection
    role: Role
    reason: str


def more_pressured_role(p: PoolPressure, cfg: FluidRoleConfig) -> Role:
    """The phase further past its threshold: PPI-bar / PPI^high against the decode pool's
    larger of DPI-bar_load / DPI_load^high and DPI-bar_adm / DPI_adm^high."""
    prefill = p.ppi_bar / cfg.ppi_high
    decode = max(p.dpi_load_bar / cfg.dpi_load_high, p.dpi_adm_bar / cfg.dpi_adm_high)
    return Role.PREFILL if prefill >= decode else Role.DECODE


def spare_role(p: PoolPressure, cfg: FluidRoleConfig) -> Role | None:
    """A phase that can give up one worker and stay calm, or None when neither can.

    Calm means below the *low* side of FluidRole's thresholds after the pool shrinks (the same
    projection FluidRole uses before a switch), so that a removal never creates the pressure
    that would trigger the next scale-out. Of two candidates, the one with more room goes.
    """
    prefill_ok = prefill_can_spare_one(p, cfg)
    decode_ok = decode_can_spare_one(p, cfg) and (
        p.n_decode > 1 and p.dpi_adm_bar * p.n_decode / (p.n_decode - 1) < cfg.dpi_adm_high
    )
    if prefill_ok and decode_ok:
        prefill_room = p.ppi_bar / cfg.ppi_low
        decode_room = p.dpi_load_bar / cfg.dpi_load_high
        return Role.PREFILL if prefill_room <= decode_room else Role.DECODE
    if prefill_ok:
        return Role.PREFILL
    if decode_ok:
        return Role.DECODE
    return None


class CapacityFallback:
    """Stateful scale-out/scale-in decisions; the harness calls ``observe`` once per interval."""

    def __init__(self, cfg: FallbackConfig, role_cfg: FluidRoleConfig) -> None:
        self.cfg = cfg
        self.role_cfg = role_cfg
        self._pressured_since: float | None = None
        self._calm_since: float | None = None

    def observe(
        self,
        now: float,
        recommendation: Recommendation,
        pressure: PoolPressure,
        workers: int,
        floor: int,
        settled: bool = True,
    ) -> ScaleDecision | None:
        """One interval: ``recommendation`` is FluidRole's raw recommendation this interval,
        ``workers`` the current worker count and ``floor`` the count the user asked for."""
        if recommendation is Recommendation.NEEDS_CAPACITY:
            self._calm_since = None
            if self._pressured_since is None:
                self._pressured_since = now
        else:
            self._pressured_since = None
            role = spare_role(pressure, self.role_cfg)
            if role is None:
                self._calm_since = None
            elif self._calm_since is None:
                self._calm_since = now
        if not self.cfg.enabled or not settled:
            return None
        since = self._pressured_since
        if since is not None and now - since >= self.cfg.scale_out_after_s:
            if workers >= self.cfg.max_workers:
                return None
            self._pressured_since = now  # the next worker needs its own full period
            role = more_pressured_role(pressure, self.role_cfg)
            return ScaleDecision(ScaleDirection.OUT, role, "both phases pressured")
        calm = self._calm_since
        if calm is not None and workers > floor and now - calm >= self.cfg.scale_in_after_s:
            role = spare_role(pressure, self.role_cfg)
            if role is None:
                return None
            self._calm_since = now
            return ScaleDecision(ScaleDirection.IN, role, "sustained slack")
        return None
