"""`cmq report` without Spark: the command exists and refuses a bad directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmq.cli import main


def test_report_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "report" in capsys.readouterr().out


def test_report_of_a_missing_directory_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 1
    assert "is not a directory of lab records" in capsys.readouterr().err
