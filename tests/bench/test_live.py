"""A short real run of every system, each role in its own process.

Small counts, no timing assertions: these show that each adapter works end to
end (and that a missing server is skipped with the reason), not how fast.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from cmq.lab import runner
from cmq.lab.systems import SYSTEMS, load

# Spread the two processes when there are two CPUs to spread them over.
SPREAD = "spread" if len(os.sched_getaffinity(0)) > 1 else "none"
SIZE = 64
COUNT = 2000
ROUND_TRIPS = 30
REPLY_TIMEOUT = 10.0


def _by_system(results: list[runner.Result]) -> dict[str, runner.Result]:
    return {r.system: r for r in results}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, runner.Result]]:
    # The three scenarios run at once: their workers spend most of their
    # time starting up, and nothing here is a timing assertion.
    calls = {
        "throughput": lambda: runner.run_throughput(SYSTEMS, [SIZE], count=COUNT, pin="none"),
        # A generous reply timeout: on a loaded 2-core machine a stream
        # system's reply can take far longer than the benchmark default, and
        # would count as lost (for stream systems the test expects none).
        "pingpong": lambda: runner.run_pingpong(
            SYSTEMS, [SIZE], count=ROUND_TRIPS, pin="same", timeout=REPLY_TIMEOUT
        ),
        "pingping": lambda: runner.run_pingping(
            SYSTEMS, [SIZE], count=ROUND_TRIPS, window=4, pin=SPREAD, timeout=REPLY_TIMEOUT
        ),
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: _by_system(f.result()) for name, f in futures.items()}


@pytest.fixture(scope="module")
def throughput(runs: dict[str, dict[str, runner.Result]]) -> dict[str, runner.Result]:
    return runs["throughput"]


@pytest.fixture(scope="module")
def pingpong(runs: dict[str, dict[str, runner.Result]]) -> dict[str, runner.Result]:
    return runs["pingpong"]


@pytest.fixture(scope="module")
def pingping(runs: dict[str, dict[str, runner.Result]]) -> dict[str, runner.Result]:
    return runs["pingping"]


def _measured(results: dict[str, runner.Result], system: str) -> runner.Result:
    r = results[system]
    if isinstance(r, runner.Skipped):
        pytest.skip(f"{system}: {r.reason}")
    assert not isinstance(r, runner.Failed), r.error
    return r


@pytest.mark.parametrize("system", SYSTEMS)
def test_throughput(throughput: dict[str, runner.Result], system: str) -> None:
    r = _measured(throughput, system)
    assert isinstance(r, runner.ThroughputResult)
    assert r.sent == COUNT
    assert 0 < r.delivered <= COUNT
    if not load(system).DATAGRAM:
        assert r.delivered == COUNT
    assert r.receiver["stopped"] in ("end", "idle")
    assert r.seconds >= 0 and r.msgs_per_s >= 0


@pytest.mark.parametrize("system", SYSTEMS)
def test_pingpong(pingpong: dict[str, runner.Result], system: str) -> None:
    r = _measured(pingpong, system)
    assert isinstance(r, runner.RoundTripResult)
    assert r.sent == ROUND_TRIPS and r.round_trips + r.lost == ROUND_TRIPS
    assert r.round_trips > 0
    if not load(system).DATAGRAM:
        assert r.lost == 0
    assert all(lat > 0 for lat in r.latencies_ns)


@pytest.mark.parametrize("system", SYSTEMS)
def test_pingping(pingping: dict[str, runner.Result], system: str) -> None:
    r = _measured(pingping, system)
    assert isinstance(r, runner.RoundTripResult)
    assert r.mode == "pingping"
    assert r.round_trips + r.lost == ROUND_TRIPS and r.round_trips > 0
    assert all(lat > 0 for lat in r.latencies_ns)


def test_a_worker_error_is_a_failed_run_with_the_reason() -> None:
    # cmq's roles take QueueConfig options; a bad one fails in the worker,
    # and the run reports it instead of hanging or crashing the runner.
    [r] = runner.run_pingpong(["cmq"], [4], count=1, options={"cmq": {"qthresh": -1}})
    assert isinstance(r, runner.Failed)
    assert "qthresh" in r.error and r.system == "cmq" and r.size == 4


def test_each_side_can_run_under_its_own_command_prefix() -> None:
    # The lab puts the two sides in two network namespaces with
    # ``ip netns exec``; ``env`` is a prefix that runs anywhere.
    [r] = runner.run_pingpong(
        ["udp"],
        [4],
        count=3,
        server_prefix=["env", "CMQ_BENCH_SIDE=server"],
        client_prefix=["env", "CMQ_BENCH_SIDE=client"],
        bind="127.0.0.1",
    )
    assert isinstance(r, runner.RoundTripResult), r
    assert r.round_trips + r.lost == 3


def test_a_prefix_that_fails_is_a_failed_run() -> None:
    [r] = runner.run_pingpong(["udp"], [4], count=1, prefix=["false"])
    assert isinstance(r, runner.Failed)
    assert "exited" in r.error


def test_a_missing_program_is_a_failed_run() -> None:
    [r] = runner.run_pingpong(["udp"], [4], count=1, prefix=["/nonexistent/cmq-bench-prefix"])
    assert isinstance(r, runner.Failed)
    assert "cannot start /nonexistent/cmq-bench-prefix" in r.error


def test_receiver_memory_is_sampled_over_the_run() -> None:
    [r] = runner.run_throughput(["tcp"], [64], count=1000, rss_interval=0.01)
    assert isinstance(r, runner.ThroughputResult), r
    assert r.receiver_rss, "at least the first sample, taken at start"
    times = [t for t, _ in r.receiver_rss]
    assert times == sorted(times)
    assert all(rss > 0 for _, rss in r.receiver_rss)
