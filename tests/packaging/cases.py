"""What the packaging tests run: every command's --help, and a command per extra that needs it.

Shared by the in-process check (extras blocked in this environment) and the
clean-venv check (extras really absent), so both hold the same promises.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cmq import cli
from cmq._extras import MODULES

__all__ = ["EXTRAS", "IMPORT_EVERY_MODULE", "help_argvs", "needs_extra_argvs"]

#: The extras of pyproject.toml that bring modules (``all`` and ``test`` only gather them).
EXTRAS = tuple(sorted({source.extra for source in MODULES.values()}))


def _subcommands(name: str) -> list[str]:
    module = cli._load(name)
    parser = argparse.ArgumentParser(prog=f"cmq {name}")
    module.configure(parser)
    verbs: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            verbs += list(action.choices)
    return verbs


def help_argvs() -> list[list[str]]:
    """``--help``, ``--version``, and ``COMMAND [VERB] --help`` for every command and verb."""
    argvs = [["--help"], ["--version"]]
    for name in cli._command_names():
        argvs.append([name, "--help"])
        argvs += [[name, verb, "--help"] for verb in _subcommands(name)]
    return argvs


def needs_extra_argvs(tmp: Path) -> list[tuple[list[str], str]]:
    """Commands that need an extra, each with that extra (its modules all absent)."""
    return [
        (["serve", "--port", "0", "--store", "memory:"], "service"),
        (["sqsbench", "throughput", "--stores", "sqlite"], "service"),
        (["lab", "--out", str(tmp / "lab"), "--quiet"], "lab"),
        (["report", str(tmp)], "lab"),
        (["broker", "--port", "0", "--amqp-port", "0", "--in-memory"], "broker"),
        (["broker", "--port", "0", "--http-port", "0", "--in-memory"], "service"),
    ]


#: ``python -c IMPORT_EVERY_MODULE '["zmq", ...]'``: imports every module of
#: cmq with the named modules blocked, and prints as JSON ``{"bad": [...],
#: "missing": [...]}``: the modules that failed other than with
#: MissingExtra's one line, and those that raised it (with its line).
IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
import cmq
bad, missing = [], []
# A package that raises is reported below, where it is imported itself.
for m in pkgutil.walk_packages(cmq.__path__, "cmq.", onerror=lambda name: None):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except cmq.MissingExtra as exc:
        if "\\n" in str(exc) or "pip install 'pycmq[" not in str(exc):
            bad.append(m.name + ": " + str(exc))
        else:
            missing.append(m.name + ": " + str(exc))
    except BaseException as exc:
        bad.append(m.name + ": " + repr(exc))
print(json.dumps({"bad": bad, "missing": missing}))
"""
