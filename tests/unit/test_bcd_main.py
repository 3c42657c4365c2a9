"""bcd's command line: refusals that need no control plane."""

from __future__ import annotations

from pathlib import Path

import pytest

from better_compute.agent.main import main


def test_positional_arguments_to_join_are_refused_without_echoing_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BCD_ROOT", str(tmp_path))
    code = main(["join", "--server", "https://h/api/compute", "bcjt_secret-in-argv"])
    err = capsys.readouterr().err
    assert code == 2
    assert "never an argument" in err and "--token-file" in err
    assert "bcjt_secret-in-argv" not in err
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize(("command", "says", "status"), [
    ("node", "bcd join", 10),  # not_initialized: the machine never joined
    ("status", "not running", 11),  # unavailable: start bcd node
])
def test_node_and_status_on_a_machine_that_never_joined(
        command: str, says: str, status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BCD_ROOT", str(tmp_path))
    assert main([command]) == status
    assert says in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "join" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("bcd ")
