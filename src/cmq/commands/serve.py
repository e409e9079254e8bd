"""Run the SQS-compatible queue service (BlueDove queues over SQLite or Redis Cluster).

Point any AWS SDK at it by changing only the endpoint URL, e.g.
boto3.client("sqs", endpoint_url="http://127.0.0.1:9324", region_name="us-east-1",
aws_access_key_id="x", aws_secret_access_key="x").

Store URLs: memory:  |  sqlite:PATH (default ./cmq-data/cmq.sqlite3)  |
redis-cluster://host:port,host:port[?wait_replicas=1&wait_timeout_ms=1000]
"""

from __future__ import annotations

import argparse

from cmq.service.config import DEFAULT_PORT, DEFAULT_SQLITE_PATH, ServiceConfig, StoreConfig


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


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Raises ConfigError on bad options."""
    from cmq.service.server import serve

    config = ServiceConfig(
        host=args.host,
        port=args.port,
        store=StoreConfig.from_url(args.store),
        workers=args.workers,
    )
    serve(config)
    return 0
