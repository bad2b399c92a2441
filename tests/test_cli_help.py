"""``fluidpd <command> --help``: every option says what it is, its default and its names.

The checks walk the real parser tree (every subcommand, the drills' sub-subcommands too), so a
new option without help fails here."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fluidpd.cli.help_format import _FLAG_ACTIONS, default_text, shows_default
from fluidpd.cli.main import build_parser, main

#: The options a newcomer meets first: their help must explain more than the flag's name.
FIRST_HOUR = {
    "up": ("--policy", "--port", "--model", "--host", "--seed", "--adaptive", "--kv-arena-mib",
           "--pairing", "--ready-timeout", "--dtype", "--weight-seed"),
    "sim": ("--rps", "--policy", "--num-requests", "--n-persist", "--min-prefill", "--min-decode",
            "--jobs"),
}  # fmt: skip


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


COMMANDS = dict(_commands(build_parser()))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.help != argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _absent_unexplained(action: argparse.Action) -> bool:
    """An option that takes a value but has none by default (None, an empty list) must say
    in its help what happens without it ("default: SGLang's own", "default: no limit"):
    argparse has nothing to print for it."""
    takes_value = not isinstance(action, _FLAG_ACTIONS) and not action.required
    return (
        takes_value
        and not shows_default(action)
        and action.default is not argparse.SUPPRESS
        and "default" not in (action.help or "").lower()
    )


def _rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option's entry in ``--help``, on one line."""
    formatter = parser._get_formatter()
    return " ".join(formatter._format_action(action).split())


def _help_of(command: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def test_every_subcommand_is_covered() -> None:
    assert {"sim", "up", "sidecar", "router", "controller", "replay", "evaluate", "compare",
            "summary", "bench", "profile", "operator", "profiles", ("drill switches")} <= {
        " ".join(c) for c in COMMANDS
    }  # fmt: skip


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_every_option_has_help_with_its_default_and_names(command: tuple[str, ...]) -> None:
    parser = COMMANDS[command]
    problems = []
    for action in _options(parser):
        flag = action.option_strings[-1]
        shown = _rendered(parser, action)
        if not (action.help or "").strip():
            problems.append(f"{flag}: no help")
            continue
        if shows_default(action) and default_text(action.default) not in shown.replace("- ", "-"):
            problems.append(f"{flag}: default {default_text(action.default)!r} not shown")
        elif _absent_unexplained(action):
            problems.append(f"{flag}: its help does not say what leaving it out does (default:)")
        for choice in action.choices or ():
            if str(choice) not in shown.replace("- ", "-"):
                problems.append(f"{flag}: choice {choice!r} not shown")
    assert not problems, f"fluidpd {' '.join(command)} --help:\n" + "\n".join(problems)


@pytest.mark.parametrize("command", sorted(FIRST_HOUR))
def test_first_hour_options_say_what_they_do(command: str) -> None:
    parser = COMMANDS[(command,)]
    by_flag = {a.option_strings[-1]: a for a in _options(parser)}
    for flag in FIRST_HOUR[command]:
        words = (by_flag[flag].help or "").split()
        assert len(words) >= 3, f"{command} {flag}: {by_flag[flag].help!r}"


def test_up_help_shows_defaults_and_policy_names() -> None:
    text = " ".join(_help_of(("up",)).split())
    assert "port of the router (the OpenAI API); 0: any free port" in text
    assert "workers files name them once it is up) (default: 8000)" in text
    assert "{static,fluidtoken,fluidrole,fluidpd}" in text
    assert "static: fixed split" in text
    assert "(default: fluidpd)" in text


def test_sim_help_names_the_policies_and_the_rate_default() -> None:
    text = " ".join(_help_of(("sim",)).split())
    assert "one of static, fluidtoken, fluidrole, fluidpd, oracle, autoscale" in text
    assert "request rates to sweep, e.g. 10,20,30 (default: 20)" in text
    assert "--n-persist N_PERSIST FluidRole switches only after" in text


def test_gpu_and_engine_model_are_told_apart() -> None:
    text = " ".join(_help_of(("up",)).split())
    assert "--gpu GPU GPU type of the profile" in text
    assert "--engine-model SHAPE the model the gpu engine runs" in text
    assert "--gpu-model" in text  # named as the deprecated old spelling
    assert "--gpu-model GPU_MODEL" not in text  # but not offered as an option


def test_deprecated_gpu_model_still_works_and_says_so() -> None:
    args = build_parser().parse_args(["profile", "--gpu-model", "tiny-qwen3", "--out", "x.yaml"])
    assert args.gpu_model == "tiny-qwen3"
    args = build_parser().parse_args(["profile", "--engine-model", "tiny-llama", "--out", "x.yaml"])
    assert args.gpu_model == "tiny-llama"
    proc = subprocess.run(
        [sys.executable, "-m", "fluidpd.cli.main", "profile", "--gpu-model", "gpt-9", "--out",
         "x.yaml"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "warning: --gpu-model is deprecated; use --engine-model" in proc.stderr
    assert "--engine-model: unknown model shape 'gpt-9'" in proc.stderr


def test_log_level_takes_names_in_any_case() -> None:
    args = build_parser().parse_args(["router", "--log-level", "INFO"])
    assert args.log_level == "info"
    with pytest.raises(Exception, match="--log-level"):
        build_parser().parse_args(["router", "--log-level", "loud"])


def test_a_token_from_the_environment_never_shows_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUIDPD_ADMIN_TOKEN", "s3cret-token")
    for command in (("router",), ("sidecar",), ("controller",), ("up",)):
        parser = dict(_commands(build_parser()))[command]  # built with the variable set
        text = parser.format_help()
        assert "s3cret-token" not in text, command
        assert "FLUIDPD_ADMIN_TOKEN" in text, command
