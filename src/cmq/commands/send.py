"""Push each line of standard input as a message to HOST:PORT.

Each line, without its newline, becomes one message (codec raw), or each
line is parsed as JSON and sent as a MessagePack value (--codec msgpack).
Messages are batched as by any cmq endpoint; on end of input, SIGINT or
SIGTERM everything pending is sent before the command exits. With reliable
delivery (the default) it then waits up to --linger seconds for the
receiver to acknowledge everything; what it could not confirm is reported
on standard error and the exit status is 1.

  cmq recv --port 4711 | grep --line-buffered ERROR | cmq send 127.0.0.1:4712
"""

from __future__ import annotations

import argparse
import json
import sys

from cmq._errors import ConfigError
from cmq.commands._common import add_endpoint_options, endpoint_options, exit_on_signals
from cmq.net.queue import Queue


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dest", metavar="HOST:PORT", help="where to send")
    parser.add_argument("--port", type=int, default=0, help="local UDP port to send from (default: any)")
    parser.add_argument("--bind", default="0.0.0.0", metavar="HOST", help="local address (default 0.0.0.0)")
    parser.add_argument("--stats", action="store_true", help="print the endpoint's counters to stderr at exit")
    parser.add_argument("--linger", type=float, default=10.0, metavar="SECONDS",
                        help="reliable delivery: how long to wait at the end for acknowledgements (default 10)")
    add_endpoint_options(parser)


def run(args: argparse.Namespace) -> int:
    exit_on_signals()
    if args.linger < 0:
        raise ConfigError("--linger must not be negative")
    q = Queue(args.port, args.bind, linger=args.linger, **endpoint_options(args))
    try:
        q.resolve(args.dest)  # fail at once on a bad address, not at the first line
    except BaseException:
        q.close()
        raise
    msgpack_codec = args.codec == "msgpack"
    sent = 0
    try:
        push, dest, mailbox = q.push, args.dest, args.mailbox
        for lineno, line in enumerate(sys.stdin.buffer, 1):
            data = line[:-1] if line.endswith(b"\n") else line
            if msgpack_codec:
                try:
                    value = json.loads(data)
                except ValueError as exc:
                    raise ConfigError(f"line {lineno} is not JSON: {exc}") from None
                push(dest, value, mailbox)
            else:
                push(dest, data, mailbox)
            sent += 1
    except KeyboardInterrupt:
        pass
    finally:
        q.close()  # waits up to --linger for acknowledgements
        if args.stats:
            print(json.dumps(q.stats().as_dict()), file=sys.stderr)
    in_doubt = q.stats().in_doubt
    if in_doubt:
        for failure in q.failures():
            print(
                f"cmq send: {len(failure.messages)} message(s) to {failure.dest[0]}:{failure.dest[1]} "
                f"not confirmed ({failure.reason.replace('_', ' ')})",
                file=sys.stderr,
            )
        print(f"cmq send: {sent - in_doubt} of {sent} message(s) confirmed, {in_doubt} in doubt", file=sys.stderr)
        return 1
    return 0
