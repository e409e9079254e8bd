"""Write each message received on a UDP port to standard output, one per line.

Raw messages are written as they are, each followed by a newline; with
--codec msgpack each value is written as one line of JSON. Output is flushed
whenever no more messages are waiting, so the command works inside a
pipeline. Ends on SIGINT, SIGTERM, a closed output, after --count messages,
or after --idle seconds without a message.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cmq._errors import Timeout
from cmq.commands._common import add_endpoint_options, endpoint_options, exit_on_signals
from cmq.net.queue import Queue


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, required=True,
                        help="UDP port to receive on (0: one the kernel picks, printed on stderr)")
    parser.add_argument("--host", default="0.0.0.0", help="local address (default 0.0.0.0)")
    parser.add_argument("--count", type=int, default=None, help="exit after this many messages")
    parser.add_argument("--idle", type=float, default=None, metavar="SECONDS",
                        help="exit after this long without a message")
    parser.add_argument("--join", action="append", default=[], metavar="GROUP",
                        help="also receive multicast GROUP (repeatable)")
    parser.add_argument("--stats", action="store_true", help="print the endpoint's counters to stderr at exit")
    add_endpoint_options(parser)


def _default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(type(value).__name__)


def run(args: argparse.Namespace) -> int:
    exit_on_signals()
    options = endpoint_options(args)
    if args.join:
        options["reuse_addr"] = True
    q = Queue(args.port, args.host, **options)
    if args.port == 0:
        # The kernel chose the port: say which, or nobody can send to it.
        host, port = q.address[0], q.port
        print(f"cmq recv: receiving on {host}:{port}", file=sys.stderr, flush=True)
    for group in args.join:
        q.join(group)
    out = sys.stdout.buffer
    as_json = args.codec == "msgpack"
    n = 0
    try:
        while args.count is None or n < args.count:
            try:
                msg = q.get(timeout=args.idle, mailbox=args.mailbox)
            except Timeout:
                break
            while msg is not None:
                if as_json:
                    out.write(json.dumps(msg, default=_default).encode() + b"\n")
                else:
                    out.write(msg if msg.endswith(b"\n") else msg + b"\n")
                n += 1
                if args.count is not None and n >= args.count:
                    break
                msg = q.pop(args.mailbox)
            out.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        q.close()
        if args.stats:
            print(json.dumps(q.stats().as_dict()), file=sys.stderr)
        try:
            out.flush()
        except BrokenPipeError:
            pass
    return 0
