"""The statistics behind the report's verdicts: a bootstrap interval of a
ratio between two systems, and the three-way rule that turns it into a verdict.

Theory of operation
-------------------
A run (one process pair, one system, one cell) is the unit of repetition:
on a shared 2-core machine the spread *between* runs (scheduling, caches,
what else ran) dwarfs the spread within one, so resampling single round
trips of one run would give intervals far narrower than the truth. Each
system's value in a cell is therefore the median over its runs of a per-run
statistic (a median round trip, msgs/s), and the interval of the ratio of
two systems' values is a percentile bootstrap that resamples runs, each
system's independently (:func:`ratio_interval`). When the two sides were
measured in the same rounds, the ratio of each round is the unit instead,
and the bootstrap resamples rounds (:func:`paired_interval`).

:func:`decide` applies a claim's threshold to that interval: *pass* only when
the whole interval is on the right side of the threshold, *fail* only when
the whole interval is on the wrong side, and *inconclusive* otherwise, or
with fewer than :data:`MIN_RUNS` runs on either side. The threshold and the
side are part of the claim's rule, fixed before anything is measured.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "LEVEL",
    "MIN_RUNS",
    "RESAMPLES",
    "Interval",
    "combine",
    "decide",
    "decide_within",
    "paired_interval",
    "ratio_interval",
]

#: Fewer runs than this on either side: no verdict (a bootstrap of two
#: values says nothing about their spread).
MIN_RUNS: Final = 3
#: Bootstrap resamples (the interval's ends move by well under 1 % between seeds).
RESAMPLES: Final = 4000
#: Coverage of the interval.
LEVEL: Final = 0.95

Side = Literal["at_most", "at_least"]


@dataclass(frozen=True)
class Interval:
    """A ratio ``point`` (of the two sides' medians) and its bootstrap interval ``[lo, hi]``."""

    point: float
    lo: float
    hi: float
    runs_a: int
    runs_b: int

    def __str__(self) -> str:
        return (
            f"{self.point:.2f}x ({LEVEL:.0%} interval {self.lo:.2f}-{self.hi:.2f}, "
            f"{self.runs_a} vs {self.runs_b} runs)"
        )

    @property
    def enough(self) -> bool:
        """Whether both sides have at least :data:`MIN_RUNS` runs."""
        return min(self.runs_a, self.runs_b) >= MIN_RUNS


def ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    *,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """``statistic(a) / statistic(b)`` with a percentile bootstrap interval.

    ``a`` and ``b`` are per-run values of two systems in one cell; each is
    resampled with replacement on its own. Seeded: the same runs give the
    same interval. Raises ValueError when a side is empty or a value is not
    positive (a ratio of round trips or rates needs positive values).
    """
    if not a or not b:
        raise ValueError("a ratio needs at least one run on each side")
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("per-run values must be positive")
    point = statistic(a) / statistic(b)
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    # ``choices`` draws a whole resample in C: the page judges about a
    # hundred intervals, and a per-element ``randrange`` loop cost seconds.
    a, b = list(a), list(b)
    ratios = sorted(
        statistic(rng.choices(a, k=na)) / statistic(rng.choices(b, k=nb))
        for _ in range(resamples)
    )
    tail = (1 - level) / 2
    lo = ratios[int(tail * (resamples - 1))]
    hi = ratios[int((1 - tail) * (resamples - 1))]
    return Interval(point=point, lo=lo, hi=hi, runs_a=na, runs_b=nb)


def paired_interval(
    ratios: Sequence[float],
    *,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """``statistic(ratios)`` with a percentile bootstrap interval that resamples
    the ratios themselves.

    For paired runs: each ratio is two systems (or two configurations)
    measured in the same round, so what disturbed the round disturbed both
    and divides out; resampling rounds keeps each pair together. Both
    ``runs_a`` and ``runs_b`` of the answer are the number of pairs. Seeded.
    Raises ValueError when ``ratios`` is empty or a ratio is not positive.
    """
    if not ratios:
        raise ValueError("a paired interval needs at least one pair")
    if min(ratios) <= 0:
        raise ValueError("ratios must be positive")
    rng = random.Random(seed)
    n = len(ratios)
    pool = list(ratios)
    points = sorted(statistic(rng.choices(pool, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return Interval(
        point=statistic(ratios),
        lo=points[int(tail * (resamples - 1))],
        hi=points[int((1 - tail) * (resamples - 1))],
        runs_a=n,
        runs_b=n,
    )


def decide(interval: Interval, threshold: float, side: Side) -> Literal["pass", "fail", "inconclusive"]:
    """The verdict of "the ratio is ``side`` ``threshold``" for ``interval``.

    ``at_most``: pass when ``hi <= threshold``, fail when ``lo > threshold``;
    ``at_least``: pass when ``lo >= threshold``, fail when ``hi < threshold``;
    otherwise, or with too few runs, inconclusive.
    """
    if not interval.enough:
        return "inconclusive"
    if side == "at_most":
        if interval.hi <= threshold:
            return "pass"
        return "fail" if interval.lo > threshold else "inconclusive"
    if interval.lo >= threshold:
        return "pass"
    return "fail" if interval.hi < threshold else "inconclusive"


def decide_within(interval: Interval, low: float, high: float) -> Literal["pass", "fail", "inconclusive"]:
    """The verdict of "the ratio is between ``low`` and ``high``" for ``interval``:
    pass when the whole interval is inside, fail when it is wholly outside,
    otherwise (or with too few runs) inconclusive."""
    if not interval.enough:
        return "inconclusive"
    if low <= interval.lo and interval.hi <= high:
        return "pass"
    if interval.hi < low or interval.lo > high:
        return "fail"
    return "inconclusive"


def combine(verdicts: Sequence[str]) -> Literal["pass", "fail", "inconclusive"]:
    """A claim made of several cells: fail if any cell fails, pass if all pass, else inconclusive."""
    if not verdicts:
        return "inconclusive"
    if "fail" in verdicts:
        return "fail"
    return "pass" if all(v == "pass" for v in verdicts) else "inconclusive"
