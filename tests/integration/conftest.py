"""Fixtures for tests over loopback: endpoints that are always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cmq
from tests.waiting import wait_until

__all__ = ["wait_until"]


@pytest.fixture
def make_queue() -> Iterator[Callable[..., cmq.Queue]]:
    made: list[cmq.Queue] = []

    def make(**options: Any) -> cmq.Queue:
        q = cmq.Queue(0, "127.0.0.1", **options)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


@pytest.fixture
def pair(make_queue: Callable[..., cmq.Queue]) -> tuple[cmq.Queue, cmq.Queue]:
    return make_queue(), make_queue()


def dest(q: cmq.Queue) -> tuple[str, int]:
    return ("127.0.0.1", q.port)
