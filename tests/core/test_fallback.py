"""The capacity fallback: scale out only after persistent both-phase pressure, one worker at a
time, up to max_workers; scale in only after sustained slack, never below the user's count."""

from __future__ import annotations

import pytest

from fluidpd.core.fallback import (
    CapacityFallback,
    FallbackConfig,
    ScaleDirection,
    more_pressured_role,
    spare_role,
)
from fluidpd.core.fluidrole import FluidRoleConfig, PoolPressure, Recommendation
from fluidpd.core.types import Role

ROLE = FluidRoleConfig()
HOT = PoolPressure(ppi_bar=3.0, dpi_load_bar=0.7, dpi_adm_bar=0.5, n_prefill=2, n_decode=2)
CALM = PoolPressure(ppi_bar=0.05, dpi_load_bar=0.05, dpi_adm_bar=0.02, n_prefill=3, n_decode=3)
NEEDS = Recommendation.NEEDS_CAPACITY


def test_more_pressured_role_compares_against_thresholds() -> None:
    assert more_pressured_role(HOT, ROLE) is Role.PREFILL  # 3.0 / 1.0 > 0.7 / 0.6
    decode_hot = PoolPressure(1.1, 0.3, 0.9, 2, 2)  # adm 0.9 / 0.2 = 4.5 > 1.1
    assert more_pressured_role(decode_hot, ROLE) is Role.DECODE


def test_spare_role_projects_the_smaller_pool() -> None:
    assert spare_role(CALM, ROLE) is not None
    # A prefill pool of 2 at PPI 0.4 would sit at 0.8 > ppi_low with one worker less.
    p = PoolPressure(0.4, 0.5, 0.15, 2, 2)
    assert spare_role(p, ROLE) is None
    # Pools of one can never spare a worker.
    assert spare_role(PoolPressure(0.0, 0.0, 0.0, 1, 1), ROLE) is None


def test_scale_out_after_persistent_pressure_only() -> None:
    fb = CapacityFallback(FallbackConfig(enabled=True, max_workers=6, scale_out_after_s=10), ROLE)
    assert fb.observe(0.0, NEEDS, HOT, workers=4, floor=4) is None
    assert fb.observe(9.9, NEEDS, HOT, workers=4, floor=4) is None
    d = fb.observe(10.0, NEEDS, HOT, workers=4, floor=4)
    assert d is not None and d.direction is ScaleDirection.OUT and d.role is Role.PREFILL
    # The next worker needs a full period of its own.
    assert fb.observe(15.0, NEEDS, HOT, workers=5, floor=4) is None
    assert fb.observe(20.0, NEEDS, HOT, workers=5, floor=4) is not None


def test_interrupted_pressure_starts_over() -> None:
    fb = CapacityFallback(FallbackConfig(enabled=True, scale_out_after_s=10), ROLE)
    fb.observe(0.0, NEEDS, HOT, 4, 4)
    fb.observe(5.0, Recommendation.NONE, HOT, 4, 4)
    assert fb.observe(12.0, NEEDS, HOT, 4, 4) is None
    assert fb.observe(22.0, NEEDS, HOT, 4, 4) is not None


def test_never_above_max_workers_nor_while_unsettled() -> None:
    fb = CapacityFallback(FallbackConfig(enabled=True, max_workers=4, scale_out_after_s=0), ROLE)
    assert fb.observe(0.0, NEEDS, HOT, workers=4, floor=4) is None
    fb = CapacityFallback(FallbackConfig(enabled=True, max_workers=8, scale_out_after_s=0), ROLE)
    assert fb.observe(0.0, NEEDS, HOT, workers=4, floor=4, settled=False) is None
    assert fb.observe(1.0, NEEDS, HOT, workers=4, floor=4, settled=True) is not None


def test_scale_in_after_sustained_slack_never_below_floor() -> None:
    fb = CapacityFallback(FallbackConfig(enabled=True, scale_in_after_s=30), ROLE)
    assert fb.observe(0.0, Recommendation.NONE, CALM, workers=6, floor=4) is None
    assert fb.observe(29.0, Recommendation.NONE, CALM, workers=6, floor=4) is None
    d = fb.observe(30.0, Recommendation.NONE, CALM, workers=6, floor=4)
    assert d is not None and d.direction is ScaleDirection.IN
    assert fb.observe(100.0, Recommendation.NONE, CALM, workers=4, floor=4) is None


def test_disabled_fallback_never_decides() -> None:
    fb = CapacityFallback(FallbackConfig(enabled=False, scale_out_after_s=0), ROLE)
    for t in range(10):
        assert fb.observe(float(t), NEEDS, HOT, 4, 4) is None
        assert fb.observe(float(t) + 0.5, Recommendation.NONE, CALM, 8, 4) is None


@pytest.mark.parametrize("field", ["max_workers", "scale_out_after_s"])
def test_config_rejects_bad_values(field: str) -> None:
    with pytest.raises(ValueError):
        FallbackConfig(**{field: -1})
