"""Options and helpers shared by the endpoint commands (send, recv, demo)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from cmq._errors import ConfigError

__all__ = ["add_endpoint_options", "endpoint_options", "exit_on_signals"]


def add_endpoint_options(parser: argparse.ArgumentParser) -> None:
    """Add the QueueConfig options a command-line endpoint may set."""
    g = parser.add_argument_group("endpoint options")
    g.add_argument("--codec", choices=("raw", "msgpack"), default="raw",
                   help="raw: each line is the message bytes; msgpack: lines are JSON values (default raw)")
    g.add_argument("--qthresh", type=int, default=None, metavar="BYTES",
                   help="flush a batch once it holds this many bytes (default 512)")
    g.add_argument("--batch-timeout", type=float, default=None, metavar="SECONDS",
                   help="most a message waits in a batch (default 0.00025)")
    g.add_argument("--max-datagram", type=int, default=None, metavar="BYTES",
                   help="largest datagram (default 65000; 1472 on a lossy Ethernet path)")
    g.add_argument("--key", default=None, metavar="HEX",
                   help="shared key in hex: datagrams are tagged, untagged ones dropped")
    g.add_argument("--key-file", type=Path, default=None, metavar="FILE",
                   help="read the shared key (raw bytes) from FILE")
    g.add_argument("--mailbox", type=int, default=0, help="mailbox to send to / read from (default 0)")
    g.add_argument("--delivery", choices=("reliable", "unordered", "best-effort"), default="reliable",
                   help="reliable (default): every message once, in order, or reported failed; "
                   "unordered: once, as it arrives; best-effort: at most once, as UDP")


def endpoint_options(args: argparse.Namespace) -> dict[str, Any]:
    """QueueConfig keyword options from parsed ``args``.

    Raises:
        ConfigError: a bad key.
    """
    options: dict[str, Any] = {"codec": args.codec, "delivery": args.delivery}
    if args.qthresh is not None:
        options["qthresh"] = args.qthresh
    if args.batch_timeout is not None:
        options["timeout"] = args.batch_timeout
    if args.max_datagram is not None:
        options["max_datagram"] = args.max_datagram
    key = key_option(args.key, args.key_file)
    if key is not None:
        options["key"] = key
    return options


def key_option(key: str | None, key_file: Path | None) -> bytes | None:
    """The shared key from ``--key HEX`` or ``--key-file FILE`` (None: neither).

    Raises:
        ConfigError: both given, not hexadecimal, or the file cannot be read.
    """
    if key is not None and key_file is not None:
        raise ConfigError("give --key or --key-file, not both")
    if key is not None:
        try:
            return bytes.fromhex(key)
        except ValueError:
            raise ConfigError("--key must be hexadecimal") from None
    if key_file is not None:
        try:
            return key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read --key-file: {exc.strerror}") from exc
    return None


def exit_on_signals() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so commands unwind (and flush) as on Ctrl-C."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
