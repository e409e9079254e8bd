"""Prometheus text-format metrics of one node.

Counters and histograms live in this process (each worker process exposes
its own); queue depths and in-flight counts are read from the store at
scrape time, so any node reports the same queue figures.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cmq.service.model import QueueCounts

__all__ = ["LATENCY_BUCKETS", "MESSAGE_OPS", "Metrics"]

#: Seconds; long polls (up to 20 s) land in the top buckets.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 20.0)


#: Which answered action moves how many messages, by kind: "sent" in,
#: "received" out, "deleted" (a consumer's acknowledgement).
MESSAGE_OPS = {
    "SendMessage": "sent",
    "SendMessageBatch": "sent",
    "ReceiveMessage": "received",
    "DeleteMessage": "deleted",
    "DeleteMessageBatch": "deleted",
}
#: Queues whose message counters one node keeps at most (past it, only totals).
MAX_COUNTED_QUEUES = 20_000


def messages_moved(action: str, result: Mapping[str, Any]) -> int:
    """How many messages a successful ``action`` with ``result`` moved."""
    if action in ("SendMessage", "DeleteMessage"):
        return 1
    if action == "ReceiveMessage":
        return len(result.get("Messages", ()))
    if action in ("SendMessageBatch", "DeleteMessageBatch"):
        return len(result.get("Successful", ()))
    return 0


@dataclass(slots=True)
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0


class Metrics:
    """Request, error and latency figures per action."""

    def __init__(self) -> None:
        self._requests: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Histogram] = {}
        #: Messages moved, per kind (see MESSAGE_OPS), and per (queue, kind).
        self.messages: Counter[str] = Counter()
        self.queue_messages: dict[str, Counter[str]] = {}

    def requests_total(self) -> int:
        """Requests answered so far, all actions."""
        return sum(self._requests.values())

    def count_messages(self, action: str, queue: str | None, result: Mapping[str, Any]) -> None:
        """Count the messages a successful ``action`` on ``queue`` moved."""
        kind = MESSAGE_OPS.get(action)
        if kind is None:
            return
        n = messages_moved(action, result)
        if not n:
            return
        self.messages[kind] += n
        if queue is None:
            return
        per = self.queue_messages.get(queue)
        if per is None:
            if len(self.queue_messages) >= MAX_COUNTED_QUEUES:
                return
            per = self.queue_messages[queue] = Counter()
        per[kind] += n

    def observe(self, action: str, seconds: float, error_code: str | None) -> None:
        """Count one finished request of ``action``."""
        self._requests[action] = self._requests.get(action, 0) + 1
        if error_code is not None:
            key = (action, error_code)
            self._errors[key] = self._errors.get(key, 0) + 1
        h = self._latency.get(action)
        if h is None:
            h = self._latency[action] = _Histogram()
        h.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h.total += seconds
        h.n += 1

    def render(self, queues: Mapping[str, QueueCounts]) -> str:
        """The Prometheus text exposition of everything, with ``queues``' depths."""
        out = [
            "# HELP cmq_sqs_requests_total Requests answered, per action.",
            "# TYPE cmq_sqs_requests_total counter",
        ]
        out += [
            f'cmq_sqs_requests_total{{action="{a}"}} {n}' for a, n in sorted(self._requests.items())
        ]
        out += [
            "# HELP cmq_sqs_errors_total Error replies, per action and error code.",
            "# TYPE cmq_sqs_errors_total counter",
        ]
        out += [
            f'cmq_sqs_errors_total{{action="{a}",code="{c}"}} {n}'
            for (a, c), n in sorted(self._errors.items())
        ]
        out += [
            "# HELP cmq_sqs_messages_total Messages sent, received and deleted.",
            "# TYPE cmq_sqs_messages_total counter",
        ]
        out += [
            f'cmq_sqs_messages_total{{op="{k}"}} {self.messages[k]}'
            for k in ("sent", "received", "deleted")
        ]
        out += [
            "# HELP cmq_sqs_request_seconds Request latency, per action.",
            "# TYPE cmq_sqs_request_seconds histogram",
        ]
        for action, h in sorted(self._latency.items()):
            running = 0
            for bound, count in zip((*LATENCY_BUCKETS, "+Inf"), h.counts, strict=True):
                running += count
                out.append(
                    f'cmq_sqs_request_seconds_bucket{{action="{action}",le="{bound}"}} {running}'
                )
            out.append(f'cmq_sqs_request_seconds_sum{{action="{action}"}} {h.total:.6f}')
            out.append(f'cmq_sqs_request_seconds_count{{action="{action}"}} {h.n}')
        for metric, help_text, attr in (
            ("cmq_queue_messages", "Visible messages per queue.", "visible"),
            ("cmq_queue_messages_in_flight", "In-flight messages per queue.", "in_flight"),
            ("cmq_queue_messages_delayed", "Delayed messages per queue.", "delayed"),
        ):
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
            out += [
                f'{metric}{{queue="{name}"}} {getattr(c, attr)}'
                for name, c in sorted(queues.items())
            ]
        return "\n".join(out) + "\n"
