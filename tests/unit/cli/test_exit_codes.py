"""Exit codes tell a usage error (2) from a failure (3) and from a "no" verdict (1), and an
error is one line naming what failed: a path that cannot be written, never an exception's
repr or a traceback (unless it is a bug)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from core.errors import CascadeError, UsageError
from core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_REJECTED, EXIT_USAGE, fail


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "file"
    path.write_text("")
    return path


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)
    monkeypatch.delenv("CASCADE_ARTIFACTS", raising=False)


def test_the_codes_are_distinct_and_listed_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert (EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED) == (0, 1, 2, 3)
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == EXIT_OK
    help_text = capsys.readouterr().out
    assert "exit codes (every command):" in help_text
    for line in ("  0  success", "  1  the answer", "  2  usage error", "  3  failure"):
        assert line in help_text


def test_errors_become_one_line_and_their_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(UsageError("--a and --b go together"), "cascade x") == EXIT_USAGE
    assert fail(CascadeError("lock 'x' is held")) == EXIT_FAILED
    assert fail(NotADirectoryError(20, "Not a directory", "/state/x")) == EXIT_FAILED
    assert fail(ConnectionRefusedError(111, "Connection refused")) == EXIT_FAILED
    assert capsys.readouterr().err.splitlines() == [
        "cascade x: error: --a and --b go together",
        "cascade: error: lock 'x' is held",
        "cascade: error: cannot access /state/x: Not a directory",
        "cascade: error: Connection refused",
    ]


def test_an_unexpected_error_is_a_failure_with_its_traceback_never_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        int(float("inf"))
    except OverflowError as error:
        assert fail(error) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.endswith(
        "cascade: error: unexpected OverflowError: cannot convert float infinity to integer\n"
    )


def test_a_secret_in_an_unexpected_error_is_masked(capsys: pytest.CaptureFixture[str]) -> None:
    fail(RuntimeError("redis://:hunter2@redis:6379/0 went away"))
    err = capsys.readouterr().err
    assert "hunter2" not in err and "redis://:***@redis:6379/0 went away" in err


def test_an_unwritable_state_dir_names_the_path(
    a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["retrain", "--artifacts", str(tmp_path / "artifacts")]
    assert main([*argv, "--state-dir", str(a_file / "state")]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err == f"cascade retrain: error: cannot write {a_file / 'state'}: Not a directory\n"


def test_an_unwritable_workdir_is_named_before_training(
    a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--workdir", str(a_file / "work")]) == EXIT_FAILED
    assert capsys.readouterr().err == (
        f"cascade: error: cannot write {a_file / 'work'}: Not a directory\n"
    )


def test_an_os_error_reaching_the_cli_names_the_path(
    a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["versions", "--artifacts", str(a_file)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err == f"cascade: error: cannot access {a_file / 'registry.json'}: Not a directory\n"


def test_a_vacuous_gate_config_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate.yaml"
    gate.write_text("floors:\n  recall@10: -5\n")
    argv = ["retrain", "--artifacts", str(tmp_path / "artifacts"), "--gate-config", str(gate)]
    assert main(argv) == EXIT_FAILED
    assert capsys.readouterr().err == (
        f"cascade retrain: error: gate config {gate}: floors.recall@10: -5 is below 0, "
        "so the check could never fail\n"
    )
    assert not (tmp_path / "artifacts" / "releases").exists()


def test_a_failed_atomic_write_names_the_file_not_its_temporary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from control.retrain.state import write_json

    (tmp_path / "state.json").mkdir()  # the rename over it fails
    with pytest.raises(OSError) as refused:
        write_json(tmp_path / "state.json", {"cursor": {}})
    assert fail(refused.value, "cascade retrain") == EXIT_FAILED
    assert capsys.readouterr().err == (
        f"cascade retrain: error: cannot write {tmp_path / 'state.json'}: Is a directory\n"
    )
