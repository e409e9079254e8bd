"""Message-passing strategies on top of the queue: requests, futures, replace-not-replay."""

from cmq.patterns.replace import replace, retry

__all__ = ["replace", "retry"]
