"""A kernel timer that one thread can move without waking the thread waiting on it.

The threaded driver's I/O thread fires batch deadlines. Woken by a ``select``
timeout, it needs the GIL for the few lines that find the deadline already
met (the batch filled and left); while another thread pushes flat out, each
such wake costs that thread a GIL hand-off, up to a third of its throughput
at the default 0.25 ms timeout (see the README's benchmarks). A Linux
``timerfd`` moves instead: the pushing thread sets it to the earliest batch
still waiting, a system call that wakes nobody, and the I/O thread waits on
its descriptor and wakes only when a batch is really due.

Python 3.11 has no ``os.timerfd_create`` (3.13 does), so this calls libc
through :mod:`ctypes`. Where that is not possible (not Linux, no libc, a
``time.monotonic`` that is not ``CLOCK_MONOTONIC``), :meth:`KernelTimer.open`
returns None and the driver keeps its ``select`` timeouts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from typing import Final

__all__ = ["KernelTimer"]

_CLOCK_MONOTONIC: Final = 1
_TFD_NONBLOCK: Final = 0o4000
_TFD_CLOEXEC: Final = 0o2000000
_TFD_TIMER_ABSTIME: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class KernelTimer:
    """A one-shot timer on ``time.monotonic()``'s clock, readable when it fires.

    Wait for it with ``select`` on :attr:`fd`; :meth:`set` it from any thread
    (callers serialise their calls). Not thread-safe by itself.
    """

    def __init__(self, fd: int, settime: ctypes._CFuncPtr) -> None:  # type: ignore[name-defined]
        #: The descriptor to wait on (readable once the timer fired).
        self.fd = fd
        self._settime = settime
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)
        self._closed = False

    @classmethod
    def open(cls) -> KernelTimer | None:
        """A new disarmed timer, or None where the kernel or interpreter offers none."""
        if not sys.platform.startswith("linux"):
            return None
        if time.get_clock_info("monotonic").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        create.restype = ctypes.c_int
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        settime.restype = ctypes.c_int
        fd = create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, settime)

    def set(self, at: float | None) -> None:
        """Fire at ``at`` (a ``time.monotonic()`` reading; in the past: at once), or never (None).

        Raises:
            OSError: the kernel refused (the descriptor was closed).
        """
        value = self._spec.it_value
        if at is None:
            value.tv_sec = value.tv_nsec = 0  # disarms
        else:
            at = max(at, 1e-9)  # zero would disarm
            sec = int(at)
            value.tv_sec = sec
            value.tv_nsec = int((at - sec) * 1e9)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, self._ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def clear(self) -> None:
        """Forget that it fired (its descriptor is no longer readable)."""
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, OSError):
            pass  # not fired, or fired and cleared already

    def close(self) -> None:
        """Close the descriptor. Calling it again does nothing."""
        if not self._closed:
            self._closed = True
            os.close(self.fd)
