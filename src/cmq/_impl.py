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
suite under both this way). A class whose hot fields the compiled core keeps
in C makes its objects with :func:`new_object`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Final, TypeVar

__all__ = ["ENV", "available", "implementation", "new_object", "speedups", "use", "using"]

_T = TypeVar("_T")

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


# (class, state class) -> the class's twin on that state.
_TWINS: dict[tuple[type, type], type] = {}


def new_object(cls: type[_T], state: str) -> _T:
    """A new object of ``cls``, not yet initialised (``cls.__new__``'s work).

    With the compiled core selected, it is an object of ``cls``'s twin: a
    subclass of ``_speedups.<state>`` and of ``cls``, so that the fields
    ``state`` declares are C members, which the compiled paths read and
    write without attribute lookups, while ``cls``'s methods, ``isinstance``
    and every other field (in the object's ``__dict__``) are unchanged. A
    class the twin cannot be made of (one with ``__slots__`` of its own)
    gets a plain object. With the pure core, a plain object of ``cls``.
    """
    sp = speedups
    if sp is not None:
        base: type = getattr(sp, state)
        twin = _TWINS.get((cls, base))
        if twin is None:
            try:
                twin = type(cls)(cls.__name__, (base, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
            except TypeError:  # an instance lay-out that cannot be combined
                twin = cls
            _TWINS[(cls, base)] = twin
        if twin is not cls:
            obj: Any = base.__new__(twin)
            return obj  # type: ignore[no-any-return]
    return object.__new__(cls)
