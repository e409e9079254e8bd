"""cmq.net._timer.KernelTimer: a timerfd that fires at a time.monotonic() reading."""

from __future__ import annotations

import select
import sys
import time

import pytest

from cmq.net._timer import KernelTimer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux only")


@pytest.fixture
def timer() -> KernelTimer:
    t = KernelTimer.open()
    assert t is not None, "Linux with CLOCK_MONOTONIC offers a timerfd"
    yield t
    t.close()


def readable(t: KernelTimer, within: float) -> bool:
    return bool(select.select([t.fd], [], [], within)[0])


def test_fires_at_the_time_set_and_not_before(timer: KernelTimer) -> None:
    start = time.monotonic()
    timer.set(start + 0.05)
    assert not readable(timer, 0.0)
    assert readable(timer, 5.0)
    assert time.monotonic() >= start + 0.05
    timer.clear()
    assert not readable(timer, 0.0)


def test_moving_it_later_or_disarming_it_wakes_nobody(timer: KernelTimer) -> None:
    timer.set(time.monotonic() + 0.02)
    timer.set(time.monotonic() + 3600)  # moved later before it fired
    assert not readable(timer, 0.1)
    timer.set(None)
    assert not readable(timer, 0.0)


def test_a_time_in_the_past_fires_at_once(timer: KernelTimer) -> None:
    timer.set(time.monotonic() - 1.0)
    assert readable(timer, 1.0)


def test_set_after_close_raises_and_close_twice_is_harmless(timer: KernelTimer) -> None:
    timer.close()
    with pytest.raises(OSError):
        timer.set(time.monotonic() + 1)
    timer.close()
