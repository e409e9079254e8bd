"""The lab's own worker roles, run as processes: polled ping-pong, and bad usage."""

from __future__ import annotations

import math

import pytest

from cmq.lab.experiments import _worker
from cmq.lab.experiments._proc import READY_TIMEOUT, WorkerError, pair


@pytest.mark.parametrize("idle_gap", [5e-6, math.inf], ids=["idle-rule-on", "idle-rule-off"])
def test_polled_ping_pong_completes_every_round_trip(idle_gap: float) -> None:
    options = {"qthresh": 512, "timeout": 0.001, "idle_gap": idle_gap}
    server, client = pair(
        "poll-echo",
        {"options": options, "startup": READY_TIMEOUT, "idle": 5.0},
        "poll-pingpong",
        # Generous: a loaded 2-core machine may stall a process for seconds.
        {"options": options, "size": 64, "count": 5, "timeout": 10.0},
        client_time=60.0,
    )
    assert server == {"echoed": 5, "stopped": "end"}, (server, client)
    assert len(client["send_ns"]) == 5 and client["stale"] == 0, client
    assert all(r > s for s, r in zip(client["send_ns"], client["recv_ns"], strict=True)), client


def test_a_worker_that_fails_says_why() -> None:
    with pytest.raises(
        WorkerError, match=r"poll-echo: exited with code 1.*unknown option.*no_such_option"
    ):
        pair("poll-echo", {"options": {"no_such_option": 1}, "startup": 1.0, "idle": 1.0},
             "poll-pingpong", {}, client_time=1.0)  # fmt: skip


def test_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert _worker.main([]) == 2
    assert _worker.main(["no-such-role", "{}"]) == 2
    assert "usage:" in capsys.readouterr().err
