"""The ``cmq`` command.

Each subcommand is one module in :mod:`cmq.commands` that defines
``configure(parser)`` and ``run(args) -> int``; its docstring's first line is
the one-line help. Modules are imported only when their command runs, so
``cmq send`` never pays for importing PySpark.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
import sys
from types import ModuleType

import cmq.commands
from cmq._errors import CmqError
from cmq._extras import missing_extra

__all__ = ["main"]

_PROG = "cmq"


def _command_names() -> list[str]:
    return sorted(
        m.name.replace("_", "-")
        for m in pkgutil.iter_modules(cmq.commands.__path__)
        if not m.name.startswith("_")
    )


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"cmq.commands.{name.replace('-', '_')}")


def _summary(name: str) -> str:
    # Read the first docstring line without importing the module (which may
    # import heavy packages).
    spec = importlib.util.find_spec(f"cmq.commands.{name.replace('-', '_')}")
    if spec is None or spec.origin is None:
        return ""
    import ast

    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _version() -> str:
    """``cmq VERSION (CORE)``: the core says whether the compiled one runs, and if not, why.

    pip shows a build's output only with ``-v``, so the one line an install
    from the sdist prints when it cannot compile the core is mostly unseen:
    this is where a user finds out afterwards.
    """
    from cmq import _impl

    if _impl.implementation() == "compiled":
        core = "compiled core"
    elif _impl.available():
        core = f"pure-Python core: {_impl.ENV} is set"
    else:
        core = "pure-Python core: the compiled core was not built when cmq was installed"
    return f"{_PROG} {cmq.__version__} ({core})"


def _top_help() -> str:
    names = _command_names()
    width = max((len(n) for n in names), default=0)
    lines = [
        f"usage: {_PROG} COMMAND [options]",
        "",
        "cmq: a lightweight, inherently asynchronous UDP message queue.",
        "",
        "commands:",
    ]
    lines += [f"  {n.ljust(width)}  {_summary(n)}" for n in names]
    lines += [
        "",
        f"Run '{_PROG} COMMAND --help' for the options of one command, "
        f"'{_PROG} --version' for the version and which core runs.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cmq`` command; returns the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if args else 2
    if args[0] == "--version":
        print(_version())
        return 0
    name = args[0]
    if name not in _command_names():
        print(f"{_PROG}: unknown command {name!r}\n\n{_top_help()}", file=sys.stderr)
        return 2
    try:
        module = _load(name)
        parser = argparse.ArgumentParser(
            prog=f"{_PROG} {name}",
            description=(module.__doc__ or "").strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(parser)
        ns = parser.parse_args(args[1:])
        return int(module.run(ns) or 0)
    except KeyboardInterrupt:
        return 130
    except CmqError as exc:
        print(f"{_PROG} {name}: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        # The safety net: an optional module imported outside
        # cmq._extras.optional_imports still ends in the one line naming its
        # extra, not in a traceback.
        error = missing_extra(exc, "this command")
        if error is None:
            raise
        print(f"{_PROG} {name}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
