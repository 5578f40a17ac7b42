"""Every numeric option of every `cascade` command is checked as it is parsed: a value that
is not a finite number in range is a usage error (exit 2) naming the option and the value,
before the command does anything."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli import options as opt
from cli.main import _commands, main
from core.errors import WriteError
from core.exit_codes import EXIT_USAGE
from core.files import writable_dir


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == EXIT_USAGE
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rollout", "2", "--interval-s", "inf"], "--interval-s: must be a finite number > 0"),
        (["rollout", "2", "--min-step-s", "nan"], "--min-step-s: must be a finite number > 0"),
        (["rollout", "2", "--apply-deadline-s", "nan"], "--apply-deadline-s: must be a finite"),
        (["rollout", "2", "--step-deadline-s", "-1"], "--step-deadline-s: must be a finite"),
        (["rollout", "2", "--margin", "1"], "--margin: must be a finite number in [0, 1)"),
        (["rollout", "2", "--alpha", "1"], "--alpha: must be a finite number in (0, 1)"),
        (["rollout", "2", "--min-impressions", "0"], "--min-impressions: must be an integer"),
        (["rollout", "2", "--min-requests", "1.5"], "--min-requests: must be an integer >= 1"),
        (["rollout", "2", "--metrics-port", "70000"], "--metrics-port: must be an integer in"),
        (["rollout", "2", "--steps", "0.5,0.2"], "--steps: must be canary weights in (0, 1)"),
        (["rollout", "2", "--steps", "0.1,x"], "--steps: must be canary weights"),
        (["rollout", "2", "--steps", "0.1,1"], "--steps: must be canary weights"),
        (["simulate", "--rate", "0"], "--rate: must be a finite number > 0"),
        (["simulate", "--duration", "inf"], "--duration: must be a finite number > 0"),
        (["simulate", "--k", "501"], "--k: must be an integer in [1, 500]"),
        (["simulate", "--seed", "-1"], "--seed: must be an integer >= 0"),
        (["simulate", "--shift-at", "-1"], "--shift-at: must be a finite number >= 0"),
        (["train", "--users", "0"], "--users: must be an integer >= 1"),
        (["train", "--base-fraction", "0"], "--base-fraction: must be a finite number in (0, 1]"),
        (["train", "--two-tower-lr", "nan"], "--two-tower-lr: must be a finite number > 0"),
        (["train", "--history-dropout", "1"], "--history-dropout: must be a finite number in"),
        (["train", "--dlrm-dim", "6"], "--dlrm-dim: dlrm_dim must be a multiple of 4"),
        (["train", "--seed", "-1"], "--seed: must be an integer >= 0"),
        (["retrain", "--lock-ttl", "inf"], "--lock-ttl: must be a finite number > 0"),
        (["retrain", "--gc-keep", "-1"], "--gc-keep: must be an integer >= 0"),
        (["retrain", "--base-fraction", "1.5"], "--base-fraction: must be a finite number in"),
        (["retrain", "--temperature", "nan"], "--temperature: must be a finite number > 0"),
        (["serve", "--port", "0"], "--port: must be an integer in [1, 65535]"),
        (["serve", "--workers", "0"], "--workers: must be an integer >= 1"),
        (["serve", "--triton-http-port", "65534"], "--triton-http-port: must be an integer in"),
        (["serve", "--triton-log-max-bytes", "10"], "--triton-log-max-bytes: must be an integer"),
        (["materialize", "--version", "0"], "--version: must be an integer >= 1"),
        (["gc", "--keep", "-1"], "--keep: must be an integer >= 0"),
        (["report", "--minutes", "inf"], "--minutes: must be a finite number > 0"),
        (["report", "--step", "nan"], "--step: must be a finite number >= 0"),
    ],
)
def test_a_bad_number_is_a_usage_error_naming_the_option_and_value(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    err = _usage_error(capsys, argv)
    assert f"argument {message}" in err
    assert f"got '{argv[-1]}'" in err and "Traceback" not in err


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="cascade")
    commands = parser.add_subparsers(dest="command")
    for add_parser, _ in _commands().values():
        add_parser(commands)
    return dict(commands.choices)


def test_no_numeric_option_is_parsed_unchecked() -> None:
    unchecked = [
        f"{name} {action.option_strings[0]}"
        for name, parser in _subcommands().items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert unchecked == []


def test_a_step_deadline_below_the_minimum_step_names_both_options(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["rollout", "2", "--artifacts", str(tmp_path), "--min-step-s", "100"]
    assert main([*argv, "--step-deadline-s", "50"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (
        "cascade rollout: error: --step-deadline-s (50) must be at least --min-step-s (100): "
        "every step would time out before it may end\n"
    )
    assert not (tmp_path / "rollout").exists()  # refused before anything was written


def test_the_types_return_the_value_and_explain_the_rule() -> None:
    assert opt.positive_float("1e3") == 1000.0 and opt.non_negative_int("0") == 0
    assert opt.increasing_weights("0.05,0.25,0.5") == (0.05, 0.25, 0.5)
    for parse, text, rule in [
        (opt.number(float, gt=0, le=1), "0", "must be a finite number in (0, 1], got '0'"),
        (opt.number(int, ge=1), "x", "must be an integer >= 1, got 'x'"),
        (opt.number(float, lt=5), "5", "must be a finite number < 5, got '5'"),
        (opt.number(float), "-inf", "must be a finite number, got '-inf'"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        assert str(refused.value) == rule


def test_an_unwritable_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert writable_dir(tmp_path / "new" / "dir").is_dir()
    assert not list((tmp_path / "new" / "dir").iterdir())  # the probe file is gone
    with pytest.raises(WriteError) as refused:
        writable_dir(tmp_path / "file" / "x")
    assert refused.value.filename == str(tmp_path / "file" / "x")
    assert refused.value.strerror == "Not a directory"


def test_a_percent_sign_in_a_description_is_help_text() -> None:
    from pydantic import BaseModel, Field

    class Config(BaseModel):
        share: float = Field(0.1, description="Share of rows, about 10 % of them.")

    parser = argparse.ArgumentParser()
    opt.add_config_options(parser, Config)
    assert "about 10 % of them. (default: 0.1)" in " ".join(parser.format_help().split())
