"""Which core runs: the compiled extension (``cmq._speedups``) or the pure-Python one.

The compiled core replaces the per-message hot path (a push's fast half,
framing, splitting a datagram into messages, many datagrams per system call)
with C; the pure-Python modules stay the reference, and both are tested to
give byte-for-byte the same datagrams and messages. The compiled core is used
when it was built (``./bootstrap.sh`` and ``pip install`` build it where a C
compiler and the Python headers are present) unless the environment variable
``CMQ_PURE_PYTHON`` is set to anything but ``0`` or empty when cmq is imported.

Objects take their core when they are made: :func:`use` switches it for the
endpoints, batchers and receivers made afterwards (the tests run the sans-IO
suite under both this way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Final

__all__ = ["ENV", "available", "implementation", "speedups", "use", "using"]

#: Set to anything but "" or "0" to run the pure-Python core.
ENV: Final = "CMQ_PURE_PYTHON"


def _compiled() -> ModuleType | None:
    try:
        from cmq import _speedups
    except ImportError:
        return None
    module: ModuleType = _speedups
    return module


#: The compiled module when the compiled core is selected, else None.
speedups: ModuleType | None = None if os.environ.get(ENV, "") not in ("", "0") else _compiled()


def implementation() -> str:
    """``"compiled"`` when cmq's hot path runs compiled code, ``"python"`` when it runs the pure-Python core."""
    return "compiled" if speedups is not None else "python"


def available() -> bool:
    """Whether the compiled core was built and can be imported (whatever :func:`implementation` says)."""
    return _compiled() is not None


def use(name: str) -> None:
    """Select the core for objects made from now on: ``"compiled"`` or ``"python"``.

    Raises:
        ValueError: an unknown name.
        ImportError: ``"compiled"`` when the extension was not built.
    """
    global speedups
    if name == "python":
        speedups = None
    elif name == "compiled":
        module = _compiled()
        if module is None:
            raise ImportError("cmq's compiled core (cmq._speedups) is not built: run ./bootstrap.sh or reinstall cmq")
        speedups = module
    else:
        raise ValueError(f"unknown core {name!r}: expected 'compiled' or 'python'")


@contextmanager
def using(name: str) -> Iterator[None]:
    """:func:`use` ``name`` for what is made inside the block; the selection before it comes back after."""
    global speedups
    saved = speedups
    use(name)
    try:
        yield
    finally:
        speedups = saved
