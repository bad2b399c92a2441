"""The SLO, FluidToken and FluidRole options every command that runs the policies shares
(``sim``, ``up``, ``sidecar``, ``controller``), and the configs built from them."""

from __future__ import annotations

import argparse

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import add_float, non_negative_int, positive_int
from fluidpd.core.fluidrole import FluidRoleConfig, SwitchRule
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.types import SLO, DrainMode

Group = argparse._ArgumentGroup | argparse.ArgumentParser


def add_slo_options(g: Group) -> None:
    add_float(g, "--ttft-slo", 2.0, "TTFT target, s")
    add_float(g, "--tpot-slo", 0.1, "TPOT target, s")


def add_fluidtoken_options(g: Group) -> None:
    add_float(g, "--eta", 1.25, "FluidToken slack multiplier eta (eq. 15)")
    add_float(g, "--token-dpi-load-high", 0.6, "FluidToken DPI_load gate (eq. 12)")


def add_fluidrole_options(g: Group) -> None:
    add_float(g, "--ppi-low", 0.6, "FluidRole PPI low threshold", allow_zero=True)
    add_float(g, "--ppi-high", 1.0, "FluidRole PPI high threshold")
    add_float(g, "--dpi-load-high", 0.6, "FluidRole DPI_load threshold")
    add_float(g, "--dpi-adm-high", 0.2, "FluidRole DPI_adm threshold", allow_zero=True)
    add_float(g, "--interval", 1.0, "FluidRole control interval, s")
    add_float(g, "--window", 10.0, "FluidRole PPI window, s")
    g.add_argument(
        "--n-persist",
        type=positive_int,
        default=3,
        help="FluidRole switches only after pressure persists this many intervals (N_persist)",
    )
    add_float(g, "--cooldown", 5.0, "FluidRole cooldown, s", allow_zero=True)
    add_float(
        g, "--reversal-cooldown", 300.0, "cooldown before an opposite switch, s", allow_zero=True
    )
    g.add_argument(
        "--drain-mode",
        choices=[m.value for m in DrainMode],
        default=DrainMode.MIGRATE.value,
        help="D->P drain: migrate active requests (default) or wait for them (paper)",
    )
    g.add_argument(
        "--switch-rule",
        choices=[r.value for r in SwitchRule],
        default=SwitchRule.PREDICTIVE.value,
        help="predictive (default): switch only when the forecast gain beats the drain cost, "
        "undo a refuted switch; paper: eqs. (22)-(23) alone",
    )
    g.add_argument(
        "--switch-budget",
        type=non_negative_int,
        default=2,
        help="at most this many switches per 10 minutes (0 = no limit; anti-flap)",
    )
    g.add_argument(
        "--min-prefill",
        type=positive_int,
        default=1,
        help="FluidRole never leaves fewer prefill workers than this",
    )
    g.add_argument(
        "--min-decode",
        type=positive_int,
        default=1,
        help="FluidRole never leaves fewer decode workers than this",
    )


def slo_config(args: argparse.Namespace) -> SLO:
    try:
        return SLO(args.ttft_slo, args.tpot_slo)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidtoken_config(args: argparse.Namespace, enabled: bool = True) -> FluidTokenConfig:
    try:
        return FluidTokenConfig(
            enabled=enabled, eta=args.eta, dpi_load_high=args.token_dpi_load_high
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidrole_config(args: argparse.Namespace) -> FluidRoleConfig:
    try:
        return FluidRoleConfig(
            ppi_low=args.ppi_low,
            ppi_high=args.ppi_high,
            dpi_load_high=args.dpi_load_high,
            dpi_adm_high=args.dpi_adm_high,
            interval_s=args.interval,
            window_s=args.window,
            n_persist=args.n_persist,
            cooldown_s=args.cooldown,
            reversal_cooldown_s=args.reversal_cooldown,
            min_prefill=args.min_prefill,
            min_decode=args.min_decode,
            drain_mode=DrainMode(args.drain_mode),
            switch_rule=SwitchRule(args.switch_rule),
            switch_budget=args.switch_budget,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidrole_argv(args: argparse.Namespace) -> list[str]:
    """The FluidRole options as command-line arguments (to start a controller process)."""
    names = (
        "ppi_low", "ppi_high", "dpi_load_high", "dpi_adm_high", "interval", "window",
        "n_persist", "cooldown", "reversal_cooldown", "drain_mode", "min_prefill", "min_decode",
        "switch_rule", "switch_budget",
    )  # fmt: skip
    argv: list[str] = []
    for name in names:
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return argv
