"""Builds cmq's optional compiled core, ``cmq._speedups`` (Cython).

Everything else about the package is in ``pyproject.toml``. When the
extension cannot be built (no C compiler, no Python headers, no Cython, or
``CMQ_PURE_PYTHON=1`` at build time), the build says so once and the
package installs with its pure-Python core, which behaves the same, slower:
``cmq.implementation()`` tells which one runs. ``CMQ_REQUIRE_COMPILED=1``
turns that fallback into a failed build, for building the binary wheel
(``CMQ_REQUIRE_COMPILED=1 python -m build``): a wheel without the compiled
core is then never made by mistake.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# pip's cache keeps the wheel built without the compiled core: a plain
# reinstall would install that wheel again.
_NOTE = (
    "cmq: the compiled core was not built ({why}); cmq will use its pure-Python core. "
    "For the compiled core install a C compiler and the Python headers "
    "(Debian: apt install gcc python3-dev) and reinstall without pip's cache "
    "(pip install --no-cache-dir --force-reinstall pycmq)."
)


def _skip(why: str) -> list[Extension]:
    """Say once that the pure-Python core will be used; under CMQ_REQUIRE_COMPILED, fail."""
    if os.environ.get("CMQ_REQUIRE_COMPILED", "") not in ("", "0"):
        raise SystemExit(
            f"cmq: the compiled core was not built ({why}) and CMQ_REQUIRE_COMPILED is set"
        )
    print(_NOTE.format(why=why), file=sys.stderr)
    return []


class _OptionalBuildExt(build_ext):
    """build_ext that falls back to the pure-Python core instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure means: no compiled core
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._fallback(exc)

    @staticmethod
    def _fallback(exc: BaseException) -> None:
        _skip(str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)


def _extensions() -> list[Extension]:
    if os.environ.get("CMQ_PURE_PYTHON", "") not in ("", "0"):
        return _skip("CMQ_PURE_PYTHON is set")
    try:
        from Cython.Build import cythonize
    except ImportError:
        return _skip("Cython is not installed")
    # -g0: no debug information (it made the module 1.2 MB instead of about 0.2 MB).
    ext = Extension("cmq._speedups", ["src/cmq/_speedups.pyx"], extra_compile_args=["-g0"])
    try:
        return list(cythonize([ext], language_level=3, quiet=True))
    except Exception as exc:  # noqa: BLE001 - a Cython failure: fall back as for a compiler's
        return _skip(f"Cython failed: {exc}")


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
