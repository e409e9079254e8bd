"""Optional dependencies: the table of extras matches pyproject.toml, and a missing one is one line.

The commands are run with every optional module blocked (``sys.modules[name]
= None``, which imports and ``find_spec`` both treat as absent), in one child
process; ``test_dist.py`` repeats the same cases in a fresh virtual
environment where the extras are really not installed.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cmq import MissingExtra
from cmq._extras import MODULES, install_hint, optional_imports, require, unavailable

from .cases import EXTRAS, IMPORT_EVERY_MODULE, help_argvs, needs_extra_argvs

ROOT = Path(__file__).resolve().parents[2]


def _distribution(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_the_table_lists_every_distribution_of_every_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in EXTRAS:
        declared = {
            _distribution(r) for r in extras[extra] if _distribution(r) != "pycmq"
        }
        listed = {s.distribution for s in MODULES.values() if s.extra == extra}
        assert declared == listed, extra
    # "all" gathers every extra that brings modules.
    assert set(EXTRAS) <= set(re.findall(r"\w+", extras["all"][0].partition("[")[2]))


def test_a_missing_listed_module_is_one_line_naming_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(MissingExtra) as caught, optional_imports("the queue service"):
        import uvicorn  # noqa: F401
    error = caught.value
    assert str(error) == (
        "the queue service needs the 'service' extra (uvicorn is not installed): "
        "pip install 'pycmq[service]'"
    )
    assert (error.extra, error.name) == ("service", "uvicorn")
    assert isinstance(error, ModuleNotFoundError)  # old `except ImportError` still works
    assert isinstance(error.__cause__, ModuleNotFoundError)


def test_missing_extra_survives_pickling() -> None:
    # A worker process may send one back to its parent.
    error = MissingExtra("the lab needs ...", name="pyarrow", extra="lab")
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), str(back), back.name, back.extra) == (
        MissingExtra, "the lab needs ...", "pyarrow", "lab"
    )


def test_a_missing_module_that_is_no_extra_passes_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "not_an_extra_of_cmq", None)
    with pytest.raises(ModuleNotFoundError) as caught, optional_imports("x"):
        import not_an_extra_of_cmq  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(caught.value, MissingExtra)


def test_require_and_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    require("the lab", "pyarrow")  # installed here: no error
    assert unavailable("the lab", "pyarrow") is None
    monkeypatch.setitem(sys.modules, "pika", None)
    with pytest.raises(MissingExtra, match=re.escape(install_hint("lab"))):
        require("the RabbitMQ peer", "pika")
    assert unavailable("the RabbitMQ peer", "pika") == (
        "the RabbitMQ peer needs the 'lab' extra (pika is not installed): pip install 'pycmq[lab]'"
    )
    with pytest.raises(KeyError):
        require("x", "not_listed")


# Runs each argv through cmq.cli.main with the optional modules blocked, and
# prints what each did as JSON.
_DRIVER = """
import contextlib, io, json, sys
blocked, argvs = json.loads(sys.argv[1])
for name in blocked:
    sys.modules[name] = None
from cmq.cli import main
results = []
for argv in argvs:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = "raised " + repr(exc)
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(results))
"""


def _run_blocked(argvs: list[list[str]]) -> list[dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps([sorted(MODULES), argvs])],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results: list[dict[str, object]] = json.loads(proc.stdout)
    return results


def test_every_help_works_without_any_extra() -> None:
    argvs = help_argvs()
    assert ["broker", "consume", "--help"] in argvs  # the verbs are found
    for r in _run_blocked(argvs):
        assert r["code"] == 0, r
        assert str(r["out"]).strip(), r


def test_a_command_that_needs_an_extra_says_which_in_one_line(tmp_path: Path) -> None:
    cases = needs_extra_argvs(tmp_path)
    for r, (argv, extra) in zip(_run_blocked([a for a, _ in cases]), cases, strict=True):
        assert r["code"] == 1, r
        err = str(r["err"])
        assert len(err.strip().splitlines()) == 1, r
        assert err.startswith(f"cmq {argv[0]}: error: "), r
        assert f"needs the {extra!r} extra" in err and install_hint(extra) in err, r


def test_every_module_imports_or_names_its_extra() -> None:
    # Without any extra, each module of cmq imports, or raises MissingExtra
    # with its one line: never a bare ModuleNotFoundError.
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE, json.dumps(sorted(MODULES))],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["bad"] == []
    assert found["missing"]  # the blocking worked
