"""The live controller says which switch rule it really runs (issue #14): the predictive rule
needs the workers' profile, the SLO and the router's arrivals; without them it decides as the
paper rule, and says so."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fluidpd.controller.loop import FluidRoleController
from fluidpd.core.fluidrole import FluidRoleConfig, SwitchRule
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile

UNUSED: Any = None  # neither the source nor the session is touched before the first interval
PROFILE = resolve_profile("llama-3.1-8b", "a100-80gb", None)


def _controller(cfg: FluidRoleConfig, **kw: Any) -> FluidRoleController:
    return FluidRoleController(UNUSED, cfg, UNUSED, **kw)


@pytest.mark.parametrize(
    ("kw", "missing"),
    [
        ({}, "a profile and SLO"),
        ({"profile": PROFILE, "slo": SLO(2.0, 0.1)}, "the router's arrivals"),
        ({"demand": object()}, "a profile and SLO"),
    ],
)
def test_predictive_rule_without_its_inputs_is_reported_as_the_paper_rule(
    caplog: pytest.LogCaptureFixture, kw: dict[str, Any], missing: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="fluidpd.controller"):
        ctl = _controller(FluidRoleConfig(), **kw)
    assert not ctl.role.predictive
    messages = [r.getMessage() for r in caplog.records]
    assert any("--switch-rule paper" in m and missing in m for m in messages), messages


def test_predictive_rule_with_profile_slo_and_arrivals_runs_as_in_the_simulator(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="fluidpd.controller"):
        ctl = _controller(FluidRoleConfig(), profile=PROFILE, slo=SLO(2.0, 0.1), demand=object())
    assert ctl.role.predictive
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "router's arrivals" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    "cfg", [FluidRoleConfig(switch_rule=SwitchRule.PAPER), FluidRoleConfig(enabled=False)]
)
def test_no_notice_when_the_paper_rule_is_asked_for_or_fluidrole_is_off(
    caplog: pytest.LogCaptureFixture, cfg: FluidRoleConfig
) -> None:
    with caplog.at_level(logging.WARNING, logger="fluidpd.controller"):
        _controller(cfg)
    assert not caplog.records
