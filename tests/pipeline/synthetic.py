"""Synthetic lab output for the report tests: every built-in experiment,
a skipped system and one experiment nobody registered."""

from __future__ import annotations

from pathlib import Path

from cmq.lab.records import RecordWriter, RunInfo

BASE = 1_700_000_000_000_000_000
SIZES = (4, 64, 512, 4096)
N = 20
VERSIONS = {"python": "3.11", "cmq": "0.1.0"}


def _latencies(system: str, size: int, lossy: bool, rep: int = 0) -> list[int]:
    mean = {"cmq": 90_000, "tcp": 100_000, "msgpack-rpc": 300_000}[system] + 10 * size + 1000 * rep
    spread = 5_000
    if lossy and system != "cmq":
        mean *= 4
        spread *= 20
    return [mean + spread * ((i % 5) - 2) for i in range(N)]


def _pingpong(out: Path, experiment: str, system: str, loss: float, rep: int = 0) -> None:
    run = RunInfo(
        experiment=experiment, system=system, versions=VERSIONS, pin="cores:0,1", loss=loss
    )
    with RecordWriter(out, run) as w:
        for scenario in ("pingpong", "pingping"):
            for size in SIZES:
                lat = _latencies(system, size, loss > 0, rep)
                send = [BASE + 1_000_000 * i for i in range(N)]
                recv: list[int | None] = [s + d for s, d in zip(send, lat, strict=True)]
                if loss and system == "cmq":
                    recv[7] = None  # counted, not hidden
                w.record_many(
                    scenario=scenario,
                    size=size,
                    seq=list(range(N)),
                    send_ns=send,
                    recv_ns=recv,
                    round_trip=True,
                    params={"loss": loss} if experiment == "cmq-fig6" else None,
                )


def write_synthetic(out: Path) -> None:
    for system in ("cmq", "tcp", "msgpack-rpc"):
        _pingpong(out, "cmq-fig5", system, 0.0)
    for rep in range(3):  # Figure 6: rounds of a lossless baseline, then the lossy run
        for system in ("cmq", "tcp", "msgpack-rpc"):
            _pingpong(out, "cmq-fig6", system, 0.0, rep)
            _pingpong(out, "cmq-fig6", system, 0.014, rep)
    for rep in (1, 2):  # Figure 5's compared pair runs three times, as the lab does
        for system in ("cmq", "msgpack-rpc"):
            _pingpong(out, "cmq-fig5", system, 0.0, rep)
    with RecordWriter(out, RunInfo(experiment="cmq-fig5", system="nats")) as w:
        w.skip("no nats-server on 127.0.0.1:4222 (apt-get install nats-server)")

    with RecordWriter(out, RunInfo(experiment="tuning", system="cmq", versions=VERSIONS)) as w:
        for qthresh in (64, 512, 4096):
            for timeout in (0.0001, 0.2):
                rate = (
                    100_000 + (50_000 if qthresh == 512 else 0) + (10_000 if timeout == 0.2 else 0)
                )
                params = {"qthresh": qthresh, "timeout": timeout}
                for run in range(3):  # three interleaved throughput runs a cell, as the lab does
                    w.totals(
                        scenario="throughput",
                        size=64,
                        sent=rate,
                        delivered=rate,
                        duration_ns=10**9,
                        params=params,
                    )
                    w.sample(scenario="throughput", metric="msgs_per_s", value=rate * (1 + run / 100),
                             params=params)  # fmt: skip
                w.record_many(
                    scenario="latency", size=64, params=params, seq=[0, 1],
                    send_ns=[BASE, BASE + 10], recv_ns=[BASE + qthresh * 10, BASE + 10 + qthresh * 10],
                )  # fmt: skip

    with RecordWriter(out, RunInfo(experiment="scalability", system="cmq", versions=VERSIONS)) as w:
        for dests in (1, 1000, 1_000_000):
            for k in range(3):
                w.sample(metric="push_ns", x=dests, value=900 + 10 * k + dests / 10_000)
        for k in range(10):
            w.sample(
                metric="rss_bytes", t_ns=BASE + k * 10 * 10**9, value=30e6 + (1e6 if k > 1 else 0)
            )

    for system, per_msg_ns in (("cmq", 2_000), ("zmq", 1_500)):
        with RecordWriter(
            out, RunInfo(experiment="zmq-throughput", system=system, versions=VERSIONS)
        ) as w:
            for size in (1, 16, 256, 1024, 16384):
                n = 100_000
                w.totals(
                    scenario="throughput",
                    size=size,
                    sent=n,
                    delivered=n,
                    duration_ns=n * (per_msg_ns + size),
                )

    with RecordWriter(out, RunInfo(experiment="bdqs-demo", system="cmq")) as w:
        w.record_many(
            size=128,
            seq=[0, 1, 2],
            send_ns=[BASE, BASE + 1, BASE + 2],
            recv_ns=[BASE + 50, None, BASE + 60],
        )
