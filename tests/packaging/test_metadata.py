"""One version, in pyproject.toml; the changelog and `cmq --version` agree with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import cmq
from cmq import _impl, cli

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_installed_version_is_pyprojects() -> None:
    # Fails on an install older than pyproject.toml: rerun ./bootstrap.sh.
    assert cmq.__version__ == PROJECT["version"]


def test_cmq_version_prints_it_and_the_core(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.main(["--version"]) == 0
    core = "compiled core" if cmq.implementation() == "compiled" else "pure-Python core: "
    assert capsys.readouterr().out.startswith(f"cmq {PROJECT['version']} ({core}")
    # Each reason the pure-Python core runs is named.
    monkeypatch.setattr(_impl, "speedups", None)
    monkeypatch.setattr(_impl, "available", lambda: True)
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.endswith(" (pure-Python core: CMQ_PURE_PYTHON is set)\n")
    monkeypatch.setattr(_impl, "available", lambda: False)
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.endswith(
        " (pure-Python core: the compiled core was not built when cmq was installed)\n"
    )


def test_the_changelog_names_the_version_first() -> None:
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings and headings[0] == PROJECT["version"]


def test_the_changelog_and_readme_speak_to_users() -> None:
    # Nothing in them points into the project's tracker.
    for name in ("CHANGELOG.md", "README.md"):
        text = (ROOT / name).read_text()
        assert not re.search(r"(?i)\bissues?\s*#?\d", text), name


def test_the_package_says_it_is_typed() -> None:
    assert (ROOT / "src" / "cmq" / "py.typed").is_file()
    assert "Typing :: Typed" in PROJECT["classifiers"]


def test_the_license_file_is_the_mit_text_pyproject_names() -> None:
    # The wheel and the sdist carry this file (test_dist.py checks both).
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) the cmq developers\n")
    assert "WITHOUT WARRANTY OF ANY KIND" in text
