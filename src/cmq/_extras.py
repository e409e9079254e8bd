"""Optional dependencies: which extra brings which module, and one way to say one is missing.

``pip install pycmq`` installs the queue and its commands (``send``,
``recv``, ``demo``, ``bench`` against raw sockets, the broker's cmq side);
everything else comes with an extra of ``pycmq``. Code that imports an
optional module does it in one of two ways, so that a missing one always
ends in the same one-line :class:`~cmq.MissingExtra` naming the extra
(``pip install 'pycmq[service]'``), never in a bare ``ModuleNotFoundError``:

- module-level imports sit inside ``with optional_imports("the queue
  service"):`` (after the module's other imports);
- a command that would fail late (after starting servers, after a long run)
  calls ``require("the lab", "pyarrow", "pyspark")`` before it starts.

The ``cmq`` command turns any ``ModuleNotFoundError`` of a module listed here
into the same line, as a safety net for imports neither way covers.
:data:`MODULES` must list every distribution of the extras in
``pyproject.toml``; a test holds the two together.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Mapping
from typing import Final, NamedTuple

from cmq._errors import MissingExtra

__all__ = [
    "MODULES",
    "install_hint",
    "missing_extra",
    "optional_imports",
    "require",
    "unavailable",
]


class Source(NamedTuple):
    """Where an importable module comes from."""

    extra: str
    """The smallest extra of ``pycmq`` that installs it."""
    distribution: str
    """Its name on PyPI."""


#: Top-level module name -> the extra and distribution that bring it. Modules
#: cmq never imports itself (uvicorn picks up uvloop, redis-py hiredis) are
#: listed too, so that the table covers every distribution of every extra.
MODULES: Final[Mapping[str, Source]] = {
    # bench: peers for ``cmq bench`` and the lab
    "zmq": Source("bench", "pyzmq"),
    "psutil": Source("bench", "psutil"),
    # broker: the AMQP 0-9-1 listener
    "pamqp": Source("broker", "pamqp"),
    # service: ``cmq serve`` and ``cmq sqsbench``
    "starlette": Source("service", "starlette"),
    "uvicorn": Source("service", "uvicorn"),
    "redis": Source("service", "redis"),
    "aiohttp": Source("service", "aiohttp"),
    "httptools": Source("service", "httptools"),
    "uvloop": Source("service", "uvloop"),
    "hiredis": Source("service", "hiredis"),
    "jinja2": Source("service", "jinja2"),
    # lab: ``cmq lab`` and ``cmq report`` (and, through it, bench and service)
    "pyspark": Source("lab", "pyspark"),
    "pyarrow": Source("lab", "pyarrow"),
    "pandas": Source("lab", "pandas"),
    "matplotlib": Source("lab", "matplotlib"),
    "nats": Source("lab", "nats-py"),
    "pika": Source("lab", "pika"),
    "moto": Source("lab", "moto"),
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'pycmq[extra]'``."""
    return f"pip install 'pycmq[{extra}]'"


def _error(what: str, module: str) -> MissingExtra:
    source = MODULES[module]
    return MissingExtra(
        f"{what} needs the {source.extra!r} extra ({source.distribution} is not installed): "
        f"{install_hint(source.extra)}",
        name=module,
        extra=source.extra,
    )


def missing_extra(exc: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """The :class:`~cmq.MissingExtra` that ``exc`` stands for, or None.

    None when the missing module is no optional dependency of cmq (a broken
    installation, or a bug): that error should surface as it is.
    """
    if isinstance(exc, MissingExtra):
        return exc
    top = (exc.name or "").partition(".")[0]
    return _error(what, top) if top in MODULES else None


@contextlib.contextmanager
def optional_imports(what: str) -> Iterator[None]:
    """Turn a missing optional module imported in this block into a :class:`~cmq.MissingExtra`.

    ``what`` names the part of cmq that needs it, for the message ("the queue
    service needs the 'service' extra ...").

    Raises:
        MissingExtra: a module listed in :data:`MODULES` is not installed.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, what)
        if error is None or error is exc:
            raise
        raise error from exc


def require(what: str, *modules: str) -> None:
    """Check, without importing them, that ``modules`` (names from :data:`MODULES`) are installed.

    Raises:
        MissingExtra: the first one that is not, naming its extra.
    """
    for module in modules:
        if module not in MODULES:
            raise KeyError(f"{module!r} is not an optional dependency listed in cmq._extras")
        if importlib.util.find_spec(module) is None:
            raise _error(what, module)


def unavailable(what: str, *modules: str) -> str | None:
    """``None`` when ``modules`` are installed, else the one line saying which extra brings them.

    For the places that skip a peer or an experiment with a reason instead of
    failing.
    """
    try:
        require(what, *modules)
    except MissingExtra as exc:
        return str(exc)
    return None
