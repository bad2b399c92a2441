"""The FluidRole knobs a user sets, named once: the core's field, the command-line flag, the
CRD key. ``fluidpd sim|up|controller`` (``cli/policy_options.py``) and the operator
(``fluidpd_operator/spec.py``) both build their :class:`FluidRoleConfig` from this table, and
the defaults are the core's own, so a flag, a CRD field and the core cannot disagree about a
name or a default (``tests/operator/test_knobs.py`` checks the CRD's schema against it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fluidpd.core.fluidrole import FluidRoleConfig


@dataclass(frozen=True, slots=True)
class Knob:
    #: The :class:`FluidRoleConfig` field.
    field: str
    #: The command-line option.
    flag: str
    #: The key in the CRD's ``spec.fluidRole`` (``spec`` itself where ``top_level``).
    crd: str
    help: str
    #: Zero is a valid value (thresholds and cooldowns that may be off).
    zero_ok: bool = False
    top_level: bool = False

    @property
    def dest(self) -> str:
        """The argparse attribute the flag parses into."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def default(self) -> Any:
        return _DEFAULTS[self.field]

    @property
    def kind(self) -> Callable[[Any], Any]:
        """The value's type (what a flag's string or a CRD's JSON value converts to)."""
        return type(self.default)  # an Enum's class converts its value too

    @property
    def choices(self) -> list[str] | None:
        """The names a value may take (enumerated knobs), else None."""
        default = self.default
        return [m.value for m in type(default)] if isinstance(default, Enum) else None


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(FluidRoleConfig)}

FLUIDROLE_KNOBS: tuple[Knob, ...] = (
    Knob("ppi_low", "--ppi-low", "ppiLow", "FluidRole PPI low threshold", zero_ok=True),
    Knob("ppi_high", "--ppi-high", "ppiHigh", "FluidRole PPI high threshold"),
    Knob("dpi_load_high", "--dpi-load-high", "dpiLoadHigh", "FluidRole DPI_load threshold"),
    Knob("dpi_adm_high", "--dpi-adm-high", "dpiAdmHigh", "FluidRole DPI_adm threshold", True),
    Knob("interval_s", "--interval", "intervalSeconds", "FluidRole control interval, s"),
    Knob("window_s", "--window", "windowSeconds", "FluidRole PPI window, s"),
    Knob(
        "n_persist",
        "--n-persist",
        "nPersist",
        "FluidRole switches only after pressure persists this many intervals (N_persist)",
    ),
    Knob("cooldown_s", "--cooldown", "cooldownSeconds", "FluidRole cooldown, s", True),
    Knob(
        "reversal_cooldown_s",
        "--reversal-cooldown",
        "reversalCooldownSeconds",
        "cooldown before an opposite switch, s",
        True,
    ),
    Knob(
        "drain_mode",
        "--drain-mode",
        "drainMode",
        "D->P drain: migrate active requests (default) or wait for them (paper)",
    ),
    Knob(
        "switch_rule",
        "--switch-rule",
        "switchRule",
        "predictive (default): switch only when the forecast gain beats the drain cost, "
        "undo a refuted switch; paper: eqs. (22)-(23) alone",
    ),
    Knob(
        "switch_budget",
        "--switch-budget",
        "switchBudget",
        "at most this many switches per 10 minutes (0 = no limit; anti-flap)",
        zero_ok=True,
    ),
    Knob(
        "min_prefill",
        "--min-prefill",
        "minPrefill",
        "FluidRole never leaves fewer prefill workers than this",
        top_level=True,
    ),
    Knob(
        "min_decode",
        "--min-decode",
        "minDecode",
        "FluidRole never leaves fewer decode workers than this",
        top_level=True,
    ),
)


def fluidrole_config(values: Mapping[str, Any], enabled: bool = True) -> FluidRoleConfig:
    """The core's config from knob values by field name (raises ``ValueError`` on bad ones)."""
    return FluidRoleConfig(
        enabled=enabled, **{k.field: k.kind(values[k.field]) for k in FLUIDROLE_KNOBS}
    )
