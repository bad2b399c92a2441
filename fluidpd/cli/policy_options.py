"""The SLO, FluidToken and FluidRole options every command that runs the policies shares
(``sim``, ``up``, ``sidecar``, ``controller``), and the configs built from them."""

from __future__ import annotations

import argparse

from fluidpd.api import knobs
from fluidpd.api.knobs import FLUIDROLE_KNOBS
from fluidpd.cli.errors import UserError
from fluidpd.cli.options import add_float, non_negative_int, positive_int
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.types import SLO

Group = argparse._ArgumentGroup | argparse.ArgumentParser


def add_slo_options(g: Group) -> None:
    add_float(g, "--ttft-slo", 2.0, "TTFT target, s")
    add_float(g, "--tpot-slo", 0.1, "TPOT target, s")


def add_fluidtoken_options(g: Group) -> None:
    add_float(g, "--eta", 1.25, "FluidToken slack multiplier eta (eq. 15)")
    add_float(g, "--token-dpi-load-high", 0.6, "FluidToken DPI_load gate (eq. 12)")
    g.add_argument(
        "--token-split-budget",
        action="store_true",
        help="split a decode worker's stealing budget evenly among its prefill workers "
        "(eq. 17 as the paper states it; default: the whole budget, every commit counted)",
    )


def add_fluidrole_options(g: Group) -> None:
    """One option per FluidRole knob (``fluidpd/api/knobs.py``), with the core's defaults."""
    for k in FLUIDROLE_KNOBS:
        if k.kind is float:
            add_float(g, k.flag, k.default, k.help, allow_zero=k.zero_ok)
        elif k.kind is int:
            parse = non_negative_int if k.zero_ok else positive_int
            g.add_argument(k.flag, type=parse, default=k.default, help=k.help)
        else:  # an enumerated knob (drain mode, switch rule)
            g.add_argument(k.flag, choices=k.choices, default=k.default.value, help=k.help)


def slo_config(args: argparse.Namespace) -> SLO:
    try:
        return SLO(args.ttft_slo, args.tpot_slo)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidtoken_config(args: argparse.Namespace, enabled: bool = True) -> FluidTokenConfig:
    try:
        return FluidTokenConfig(
            enabled=enabled,
            eta=args.eta,
            dpi_load_high=args.token_dpi_load_high,
            split_budget=args.token_split_budget,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidrole_config(args: argparse.Namespace) -> FluidRoleConfig:
    try:
        return knobs.fluidrole_config({k.field: getattr(args, k.dest) for k in FLUIDROLE_KNOBS})
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fluidrole_argv(args: argparse.Namespace) -> list[str]:
    """The FluidRole options as command-line arguments (to start a controller process)."""
    argv: list[str] = []
    for k in FLUIDROLE_KNOBS:
        argv += [k.flag, str(getattr(args, k.dest))]
    return argv
