"""The verdict statistics: bootstrap intervals of a ratio and the three-way rule."""

from __future__ import annotations

import pytest

from cmq.pipeline.stats import MIN_RUNS, Interval, decide, ratio_interval


def test_a_clear_difference_passes_and_its_mirror_fails() -> None:
    fast = [50.0, 52.0, 49.0, 51.0, 50.5]
    slow = [100.0, 98.0, 103.0, 101.0, 99.0]
    iv = ratio_interval(fast, slow)
    assert iv.point == pytest.approx(0.5, rel=0.02)
    assert iv.lo <= iv.point <= iv.hi < 0.6
    assert decide(iv, 1.1, "at_most") == "pass"
    assert decide(ratio_interval(slow, fast), 1.1, "at_most") == "fail"
    assert decide(ratio_interval(slow, fast), 1.5, "at_least") == "pass"


def test_a_noisy_pair_is_inconclusive() -> None:
    """Run-to-run noise as measured here (raw UDP: 15.5, 41.9 and 58.2 us in three reruns)."""
    a = [15.5, 41.9, 58.2]
    b = [30.0, 35.0, 44.0]
    iv = ratio_interval(a, b)
    assert iv.lo < 1.1 < iv.hi
    assert decide(iv, 1.1, "at_most") == "inconclusive"


def test_a_stall_neither_excuses_nor_decides_the_verdict() -> None:
    """One 0.5 s round trip in a run (Figure 5's stall) once inflated the sd
    that excused it; per-run medians are untouched by it, so the verdict is
    the typical round trip's (the stall is reported beside it)."""
    import statistics

    stalled_run = [41.0] * 299 + [516_417.0]
    cmq = [statistics.median(stalled_run), 42.0, 40.5, 43.0, 41.5]
    peer = [60.0, 61.0, 59.0, 62.0, 60.5]
    assert decide(ratio_interval(cmq, peer), 1.1, "at_most") == "pass"
    # A system slow in every run fails; one good run of five among slow
    # ones leaves the interval too wide to say (it may be the typical one).
    assert decide(ratio_interval([90.0, 95.0, 92.0, 88.0, 94.0], peer), 1.1, "at_most") == "fail"
    assert decide(ratio_interval([90.0, 95.0, 92.0, 41.0, 94.0], peer), 1.1, "at_most") == "inconclusive"


def test_too_few_runs_give_no_verdict() -> None:
    iv = ratio_interval([1.0] * (MIN_RUNS - 1), [10.0] * 5)
    assert not iv.enough
    assert decide(iv, 1.1, "at_most") == "inconclusive"


def test_the_interval_is_reproducible_and_printable() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 3.0, 3.5]
    assert ratio_interval(a, b) == ratio_interval(a, b)
    text = str(Interval(point=0.5, lo=0.4, hi=0.6, runs_a=3, runs_b=4))
    assert text == "0.50x (95% interval 0.40-0.60, 3 vs 4 runs)"


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one run"):
        ratio_interval([], [1.0])
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([0.0], [1.0])


def test_a_band_passes_inside_fails_outside_and_combines() -> None:
    from cmq.pipeline.stats import combine, decide_within

    inside = Interval(point=4.0, lo=3.0, hi=5.5, runs_a=3, runs_b=3)
    above = Interval(point=20.0, lo=12.0, hi=30.0, runs_a=3, runs_b=3)
    straddling = Interval(point=7.0, lo=5.0, hi=11.0, runs_a=3, runs_b=3)
    assert decide_within(inside, 2.0, 8.0) == "pass"
    assert decide_within(above, 2.0, 8.0) == "fail"
    assert decide_within(straddling, 2.0, 8.0) == "inconclusive"
    assert decide_within(Interval(point=4.0, lo=3.0, hi=5.0, runs_a=1, runs_b=3), 2.0, 8.0) == "inconclusive"
    assert combine(["pass", "pass"]) == "pass"
    assert combine(["pass", "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", "fail"]) == "fail"
    assert combine([]) == "inconclusive"


def test_paired_interval_resamples_rounds_and_keeps_pairs_together() -> None:
    from cmq.pipeline.stats import paired_interval

    steady = paired_interval([0.90, 0.92, 0.91, 0.93, 0.89])
    assert steady.point == 0.91 and 0.89 <= steady.lo <= steady.point <= steady.hi <= 0.93
    assert steady.runs_a == steady.runs_b == 5 and steady.enough
    assert decide(steady, 0.80, "at_least") == "pass"
    assert decide(paired_interval([0.5, 1.1, 0.7, 0.95]), 0.80, "at_least") == "inconclusive"
    assert not paired_interval([0.9, 0.9]).enough  # two rounds: no verdict
    assert paired_interval([0.9, 0.95, 0.85]) == paired_interval([0.9, 0.95, 0.85])  # seeded
    with pytest.raises(ValueError):
        paired_interval([])
    with pytest.raises(ValueError):
        paired_interval([0.9, 0.0, 1.0])
