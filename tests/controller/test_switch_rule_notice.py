"""The live controller says which switch rule it really runs (issue #14: the predictive rule
needs a demand forecast the live router does not export yet)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fluidpd.controller.loop import FluidRoleController
from fluidpd.core.fluidrole import FluidRoleConfig, SwitchRule


def _controller(cfg: FluidRoleConfig) -> FluidRoleController:
    unused: Any = None  # neither the source nor the session is touched before the first interval
    return FluidRoleController(unused, cfg, unused)


def test_predictive_rule_is_reported_as_the_paper_rule_live(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="fluidpd.controller"):
        _controller(FluidRoleConfig())
    assert any("--switch-rule paper" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "cfg", [FluidRoleConfig(switch_rule=SwitchRule.PAPER), FluidRoleConfig(enabled=False)]
)
def test_no_notice_when_the_paper_rule_is_asked_for_or_fluidrole_is_off(
    caplog: pytest.LogCaptureFixture, cfg: FluidRoleConfig
) -> None:
    with caplog.at_level(logging.WARNING, logger="fluidpd.controller"):
        _controller(cfg)
    assert not caplog.records
