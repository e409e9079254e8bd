"""The runner's rules without running systems: plans, pinning, statistics, errors."""

from __future__ import annotations

import pytest

from cmq import ConfigError
from cmq.lab import runner
from cmq.lab.systems import load


def test_runs_are_interleaved_and_rotate() -> None:
    mods = [(n, load(n)) for n in ("udp", "tcp", "zmq")]
    skipped, runs = runner._plan(mods, [4, 512], rounds=2)
    assert skipped == []
    names = [(m.NAME, size) for m, size in runs]
    # Each size runs every system once before the next size, and the first
    # system changes from block to block.
    assert names == [
        ("udp", 4), ("tcp", 4), ("zmq", 4),
        ("tcp", 512), ("zmq", 512), ("udp", 512),
        ("zmq", 4), ("udp", 4), ("tcp", 4),
        ("udp", 512), ("tcp", 512), ("zmq", 512),
    ]  # fmt: skip


def test_unavailable_systems_and_oversized_messages_are_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    udp, tcp = load("udp"), load("tcp")
    monkeypatch.setattr(tcp, "available", lambda: "no tcp here: install it")
    skipped, runs = runner._plan([("udp", udp), ("tcp", tcp)], [4, 70_000], rounds=1)
    assert runner.Skipped(system="tcp", reason="no tcp here: install it") in skipped
    assert any(s.system == "udp" and s.size == 70_000 for s in skipped)
    assert [(m.NAME, size) for m, size in runs] == [("udp", 4)]
    assert skipped[0].to_json() == {"system": "tcp", "skipped": "no tcp here: install it"}


def test_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.cpus_for("none") == (None, None)
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {3, 5})
    assert runner.cpus_for("same") == (3, 3)
    assert runner.cpus_for("spread") == (3, 5)
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {2})
    with pytest.raises(ConfigError, match="needs two CPUs"):
        runner.cpus_for("spread")
    with pytest.raises(ConfigError, match="unknown pinning 'both'"):
        runner.cpus_for("both")


def test_throughput_counts_delivered_messages_first_to_last() -> None:
    r = runner.ThroughputResult(
        system="x", size=100, sent=1000, delivered=801, seconds=2.0, pin="none"
    )
    assert r.msgs_per_s == 400.0  # 800 intervals between 801 deliveries
    assert r.mb_per_s == 0.04
    assert r.delivered_fraction == 0.801
    shape = r.to_json()
    for key in ("system", "size", "sent", "delivered", "seconds", "msgs_per_s", "mb_per_s"):
        assert key in shape
    assert (
        runner.ThroughputResult(
            system="x", size=1, sent=1, delivered=1, seconds=0.0, pin="none"
        ).msgs_per_s
        == 0.0
    )


def test_round_trip_statistics_and_raw_stamps() -> None:
    send = tuple(range(0, 10_000, 1000))
    # Latencies 1..10 µs, the 6th lost.
    recv = tuple(s + (i + 1) * 1000 if i != 5 else -1 for i, s in enumerate(send))
    r = runner.RoundTripResult(
        system="x", size=4, mode="pingpong", pin="same", send_ns=send, recv_ns=recv
    )
    assert (r.sent, r.round_trips, r.lost) == (10, 9, 1)
    assert r.latencies_ns == [1000, 2000, 3000, 4000, 5000, 7000, 8000, 9000, 10000]
    st = r.stats_us()
    assert st["mean_us"] == pytest.approx(49 / 9)
    assert st["p50_us"] == 5.0 and st["p99_us"] == 10.0
    doc = r.to_json()
    assert {
        "system",
        "size",
        "round_trips",
        "lost",
        "mean_us",
        "p50_us",
        "p99_us",
        "stdev_us",
    } <= set(doc)
    assert "send_ns" not in doc
    raw = r.to_json(raw=True)
    assert raw["send_ns"] == list(send) and raw["recv_ns"] == list(recv)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"systems": ["nope"], "sizes": [4], "count": 1}, "unknown system"),
        ({"systems": [], "sizes": [4], "count": 1}, "no systems"),
        ({"systems": ["udp"], "sizes": [0], "count": 1}, "bad size 0"),
        ({"systems": ["udp"], "sizes": [], "count": 1}, "no sizes"),
        ({"systems": ["udp"], "sizes": [4]}, "count or a duration"),
        ({"systems": ["udp"], "sizes": [4], "count": 0}, "count must be"),
        ({"systems": ["udp"], "sizes": [4], "duration": -1.0}, "duration must be"),
        ({"systems": ["udp"], "sizes": [4], "count": 1, "pin": "all"}, "unknown pinning"),
        ({"systems": ["udp"], "sizes": [4], "count": 1, "rounds": 0}, "rounds"),
    ],
)
def test_bad_throughput_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        runner.run_throughput(**kwargs)  # type: ignore[arg-type]


def test_bad_round_trip_arguments() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        runner.run_pingpong(["udp"], [4], count=1, timeout=0)
    with pytest.raises(ConfigError, match="window"):
        runner.run_pingping(["udp"], [4], count=1, window=0)
    with pytest.raises(ConfigError, match="count"):
        runner.run_pingpong(["udp"], [4], count=0)


def test_pingping_skips_sizes_without_room_for_a_sequence_number() -> None:
    results = runner.run_pingping(["udp"], [2], count=1)
    assert results == [runner.Skipped(system="udp", size=2, reason="needs at least 4 bytes")]


def test_destinations_micro_benchmark_shape() -> None:
    results = runner.run_destinations((1, 500), per_destination=3, size=4, repeat=1)
    assert [r.destinations for r in results] == [1, 500]
    for r in results:
        # Batches of per_destination messages: the same datagrams either way.
        assert r.messages == 1500 and r.datagrams == 500
        assert r.ns_per_msg > 0
        assert set(r.to_json()) == {
            "destinations", "messages", "size", "qthresh", "datagrams", "ns_per_msg"
        }  # fmt: skip
    with pytest.raises(ConfigError):
        runner.run_destinations((0,))


def test_bad_rss_interval() -> None:
    with pytest.raises(ConfigError, match="rss_interval"):
        runner.run_throughput(["udp"], [4], count=1, rss_interval=0)


def test_a_client_started_beside_its_server_reads_its_peer_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner starts both sides at once and hands the client its peer on
    stdin; a client whose stdin closes first says so and exits 2."""
    import io
    import types

    from cmq.lab.systems import _common

    got: dict[str, object] = {}

    def pingpong_client(**params: object) -> dict[str, object]:
        got.update(params)
        return {"ok": True}

    fake = types.SimpleNamespace(pingpong_client=pingpong_client)
    monkeypatch.setattr("sys.stdin", io.StringIO('{"host": "127.0.0.1", "port": 9}\n'))
    assert _common.worker_main(fake, ["pingpong_client", '{"size": 4, "peer_on_stdin": true}']) == 0  # type: ignore[arg-type]
    assert got == {"size": 4, "peer": {"host": "127.0.0.1", "port": 9}}
    assert 'RESULT {"ok": true' in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert _common.worker_main(fake, ["pingpong_client", '{"peer_on_stdin": true}']) == 2  # type: ignore[arg-type]
    assert "no peer on stdin" in capsys.readouterr().err
