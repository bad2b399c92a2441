"""How ``fluidpd ... --help`` shows an option: its help text, then its default and its names.

One formatter for every subcommand, so no option's help can go stale against its default: the
default shown is the one argparse will use. An option whose help already says what its default
is (the word "default" appears in it, e.g. "default: a random one per run") is left as written;
choices hidden behind a metavar are listed by name.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Iterable
from typing import Any

#: Actions that take no value: their "default" is simply not being given.
_FLAG_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._CountAction,
)


def default_text(value: Any) -> str:
    """A default as a person types it: lists comma-joined, numbers without trailing zeros."""
    if isinstance(value, list | tuple):
        return ",".join(default_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def shows_default(action: argparse.Action) -> bool:
    """Whether the option has a default worth printing (a value, not "absent")."""
    if isinstance(action, _FLAG_ACTIONS) or action.required or not action.option_strings:
        return False
    default = action.default
    return default is not None and default is not argparse.SUPPRESS and default != []


def names_text(choices: Iterable[Any]) -> str:
    return ", ".join(str(c) for c in choices)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter plus ``(default: X)`` and, for choices behind a metavar, their
    names (``argparse.ArgumentDefaultsHelpFormatter`` would also print ``default: None`` and
    ``default: False``, and repeat defaults a help text already explains)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.help == argparse.SUPPRESS:
            return action.help
        extra = []
        if action.choices is not None and action.metavar is not None:
            extra.append(f"one of {names_text(action.choices)}")
        if shows_default(action) and "default" not in text.lower():
            extra.append(f"default: {default_text(action.default)}")
        if not extra:
            return text
        # argparse %-formats the help string: a literal % in a default must survive that.
        added = "; ".join(extra).replace("%", "%%")
        return f"{text} ({added})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Options such as --engine-model must never be cut at their hyphens.
        text = re.sub(r"\s+", " ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False)
