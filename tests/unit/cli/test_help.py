"""The CLI explains itself (issue 31): every option's help gives its default, or says what an
unset value means; one definition of ``--artifacts``; ``cascade --version``."""

from __future__ import annotations

import argparse

import pytest

from cli.main import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _options(command: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in command._actions
        if action.option_strings
        and action.nargs != 0
        and action.help != argparse.SUPPRESS
        and not action.required  # a required option has no default to show
    ]


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_option_says_its_default(name: str) -> None:
    command = _commands()[name]
    formatter = command._get_formatter()
    for action in _options(command):
        shown = formatter._expand_help(action) if action.help else ""
        assert "default" in shown.lower(), f"cascade {name} {action.option_strings[0]}: {shown!r}"
        assert "(default: None)" not in shown, f"cascade {name} {action.option_strings[0]}"


def test_artifacts_means_the_same_everywhere() -> None:
    helps = {
        action.help
        for command in _commands().values()
        for action in _options(command)
        if "--artifacts" in action.option_strings
    }
    assert helps == {"export root (default: CASCADE_ARTIFACTS, else ./artifacts)"}


def test_help_text_shows_a_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--port PORT port of the gateway (default: 8080)" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == "cascade 0.1.0"
