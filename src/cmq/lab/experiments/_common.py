"""What several experiments share: the papers they cite, the timeouts of
runs in lossy namespaces, and helpers their judges and sections have in common.

Each experiment's claims, rules and section live in its own module or
folder; this module registers nothing and imports no experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from cmq.pipeline.report import ReportData, Row, Verdict

__all__ = [
    "BROKERS",
    "BROKER_REASON",
    "CMQ_PAPER",
    "DATAGRAM_TIMEOUT",
    "STALL_FACTOR",
    "STREAM_TIMEOUT",
    "TCP_BASED",
    "ZMQ_PAPER",
    "by",
    "inconclusive",
    "stalls",
]

CMQ_PAPER: Final = "Fritsch & Walker, CMQ: a lightweight, asynchronous high-performance messaging queue for the cloud (J. Cloud Computing, 2012)"
ZMQ_PAPER: Final = "ØMQ lightweight messaging kernel v0.1 (design document)"
#: Systems whose transport is TCP (the paper's "TCP-based systems").
TCP_BASED: Final = frozenset({"tcp", "zmq", "msgpack-rpc", "nats", "rabbitmq"})
#: A round trip this many times its run's median is a stall: shown, never
#: part of a verdict (medians are untouched by it, by design).
STALL_FACTOR: Final = 100

#: Round-trip timeout of datagram systems: far above a lossless round trip
#: (well under 10 ms here), short enough that 1000 round trips with 3 % lost
#: add only seconds.
DATAGRAM_TIMEOUT: Final = 0.2
#: Round-trip timeout of stream systems: room for four retransmissions
#: (0.2 + 0.4 + 0.8 + 1.6 s) of one segment.
STREAM_TIMEOUT: Final = 5.0
#: Systems whose server is a broker outside the namespaces.
BROKERS: Final = frozenset({"nats", "rabbitmq"})
BROKER_REASON: Final = (
    "its broker runs in the host's network namespace, out of reach of the lossy "
    "namespaces: not measured under loss"
)


def inconclusive(why: str) -> Verdict:
    """An inconclusive verdict saying ``why``."""
    return Verdict(status="inconclusive", result=why)


def by(rows: Sequence[Row], *keys: str) -> dict[tuple[Any, ...], Row]:
    """``rows`` keyed by the values of ``keys`` (the last row of a key wins)."""
    return {tuple(r[k] for k in keys): r for r in rows}


def stalls(data: ReportData, experiment: str) -> list[str]:
    """Runs whose worst round trip is a stall (:data:`STALL_FACTOR` times the run's median)."""
    out = []
    for r in data.run_stat_rows(experiment):
        if r["p50_ns"] and r["max_ns"] and r["max_ns"] >= STALL_FACTOR * r["p50_ns"]:
            out.append(
                f"{r['system']} {r['scenario']} {r['size']} B: worst {r['max_ns'] / 1e3:,.0f} µs "
                f"against a median of {r['p50_ns'] / 1e3:,.1f} µs"
            )
    return sorted(out)


