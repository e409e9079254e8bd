"""Run the SQS-compatible queue service (BlueDove queues over SQLite or Redis Cluster).

Point any AWS SDK at it by changing only the endpoint URL, e.g.
boto3.client("sqs", endpoint_url="http://127.0.0.1:9324", region_name="us-east-1",
aws_access_key_id="x", aws_secret_access_key="x").

Store URLs: memory:  |  sqlite:PATH (default ./cmq-data/cmq.sqlite3)  |
redis-cluster://host:port,host:port[?wait_replicas=1&wait_timeout_ms=1000]

Who may call it: without --auth, only clients on loopback (any keys);
with --auth FILE (lines "ACCESS_KEY_ID SECRET_ACCESS_KEY"), only requests
SigV4-signed by one of those keys, from anywhere. Requests a browser sends
from another origin are always refused, and so are Host names other than IP
addresses, localhost and --host (add names with --allow-host).

The management console is at http://HOST:PORT/console/, under the same rules
(with --auth it asks for an access key id and its secret key).
"""

from __future__ import annotations

import argparse

from cmq.service.config import (
    DEFAULT_PORT,
    DEFAULT_SCHEDULING,
    DEFAULT_SQLITE_PATH,
    SCHEDULING_POLICIES,
    ServiceConfig,
    StoreConfig,
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``cmq serve``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to listen on (0: pick a free one)"
    )
    parser.add_argument(
        "--store", default=f"sqlite:{DEFAULT_SQLITE_PATH}", help="store URL (see above)"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes serving the port")
    parser.add_argument(
        "--auth",
        metavar="FILE",
        help="require SigV4 signatures by the access keys in FILE "
        "(one 'ACCESS_KEY_ID SECRET_ACCESS_KEY' pair a line, # comments)",
    )
    parser.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="without --auth, accept unauthenticated clients that are not on loopback",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host header name too (repeatable; e.g. a container's or proxy's name)",
    )
    parser.add_argument(
        "--max-queues",
        type=int,
        default=10_000,
        metavar="N",
        help="queues the store may hold; CreateQueue past it gets OverLimit (0: no bound)",
    )
    parser.add_argument(
        "--max-queue-messages",
        type=int,
        default=1_000_000,
        metavar="N",
        help="messages one queue may hold; sends past it get OverLimit (0: no bound)",
    )
    parser.add_argument(
        "--max-store-bytes",
        type=int,
        default=0,
        metavar="BYTES",
        help="bytes the store may hold (SQLite file, Redis memory); sends past it get "
        "OverLimit (default 0: no bound)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="close connections that do not finish a request in this time (default 30)",
    )
    parser.add_argument(
        "--scheduling",
        choices=SCHEDULING_POLICIES,
        default=DEFAULT_SCHEDULING,
        help="Linux scheduling policy of the node's threads (default batch: a thread the "
        "node wakes waits for the running one's time slice instead of preempting it, "
        "which costs less CPU where processes outnumber cores; normal: the usual policy)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Raises ConfigError on bad options, TransportError
    when the port cannot be bound, StoreUnavailable when the store does not open."""
    from cmq.service.server import serve

    config = ServiceConfig(
        host=args.host,
        port=args.port,
        store=StoreConfig.from_url(args.store),
        workers=args.workers,
        auth_file=args.auth,
        allow_remote_unsigned=args.insecure_allow_remote,
        allow_hosts=tuple(args.allow_host),
        request_timeout=args.request_timeout,
        max_queues=args.max_queues,
        max_queue_messages=args.max_queue_messages,
        max_store_bytes=args.max_store_bytes,
        scheduling=args.scheduling,
    )
    serve(config)
    return 0
