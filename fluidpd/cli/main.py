"""The ``fluidpd`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from fluidpd import __version__
from fluidpd.cli import (
    bench_cmd,
    controller_cmd,
    drill_cmd,
    evaluate_cmd,
    operator_cmd,
    profile_cmd,
    replay_cmd,
    router_cmd,
    sidecar_cmd,
    sim_cmd,
    summary_cmd,
    up_cmd,
)
from fluidpd.cli.errors import UserError
from fluidpd.cli.help_format import HelpFormatter
from fluidpd.cli.router_cmd import keep_torch_out
from fluidpd.profiles import ProfileError, available_profiles
from fluidpd.sim.policies import PolicyError
from fluidpd.sim.workloads import WorkloadError


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit 2 like every other user error here, and every
    option's help shows its default and its names (``help_format``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fluidpd",
        description="SLO-aware P/D-disaggregated LLM serving with in-place elasticity.",
    )
    parser.add_argument("--version", action="version", version=f"fluidpd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sim_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    summary_cmd.add_parser(sub)
    summary_cmd.add_compare_parser(sub)
    sidecar_cmd.add_parser(sub)
    router_cmd.add_parser(sub)
    controller_cmd.add_parser(sub)
    up_cmd.add_parser(sub)
    drill_cmd.add_parser(sub)
    replay_cmd.add_parser(sub)
    evaluate_cmd.add_parser(sub)
    operator_cmd.add_parser(sub)
    profile_cmd.add_parser(sub)
    profiles = sub.add_parser("profiles", help="list the shipped model x GPU profiles")
    profiles.set_defaults(func=lambda _args: print("\n".join(available_profiles())) or 0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code: int = args.func(args)
    except (UserError, ProfileError, WorkloadError, PolicyError) as exc:
        print(f"fluidpd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fluidpd: interrupted", file=sys.stderr)
        return 130
    return code


def process_main() -> int:
    """``fluidpd`` as a process of its own (the console script, ``python -m``). Settings that
    hold for the whole process are made here, not in ``main``, which other programs (the
    tests) call in their own process."""
    if sys.argv[1:2] == ["router"]:
        keep_torch_out()
    return main()


if __name__ == "__main__":
    sys.exit(process_main())
