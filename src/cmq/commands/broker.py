"""Run an AMQP-style broker on cmq, or talk to one (declare, bind, publish, consume).

Serve:   cmq broker --port 5700                        (durable state in ./cmq-data/)
         cmq broker --port 5700 --data-dir /var/lib/cmq  (or --in-memory: nothing kept)
         cmq broker --port 5700 --amqp-port 5673 --users users.txt   (also AMQP 0-9-1 over TCP)
         cmq broker --port 5700 --amqp-port 5673 --users definitions.json   (RabbitMQ's users and permissions)
         cmq broker --port 5700 --amqp-port 5673 --amqps-port 5671 --tls-cert cert.pem --tls-key key.pem
         cmq broker --port 5700 --http-port 15700      (the web console at /console/, /metrics)
Client:  cmq broker declare-exchange prices --type topic
         cmq broker declare-queue ibm --max-length 1000 --overflow reject
         cmq broker bind ibm prices 'stock.ibm.#'
         cmq broker publish prices stock.ibm.nyse 'IBM 101.5'
         cmq broker consume ibm --count 1
         cmq broker stats
Users:   cmq broker hash-password  (a password_hash for a RabbitMQ definitions file, --users)
Bench:   cmq broker bench        (TE-SPSC 1 vs 1024 bindings; DE-SPSC vs RabbitMQ)
         cmq broker bench-durable  (confirmed persistent 1 KB publishes/s, vs RabbitMQ)

Client verbs reach the broker at --broker HOST:PORT (default 127.0.0.1:5700),
given before or after the verb. Errors from the broker (unknown type, conflicting redeclaration, ...) are
printed with their code and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cmq._errors import ConfigError, MissingExtra, RemoteError, Timeout
from cmq._extras import require

if TYPE_CHECKING:
    from cmq.routing import BrokerClient, Users

__all__ = ["DEFAULT_PORT", "configure", "run"]

# Beside AMQP's 5672, not on it: RabbitMQ is often running there.
DEFAULT_PORT: Final = 5700


DEFAULT_BROKER: Final = f"127.0.0.1:{DEFAULT_PORT}"
# In the directory the broker starts in, as ``cmq serve``'s store: a broker
# restarted in the same place finds its durable queues.
DEFAULT_DATA_DIR: Final = "cmq-data"
DEFAULT_TIMEOUT: Final = 2.0


def _client_args(p: argparse.ArgumentParser, *, here: bool = False) -> None:
    # Accepted before the verb (on the broker command, ``here``) and after it
    # (on each verb, where an absent option leaves the first one's value:
    # argparse.SUPPRESS adds nothing to the namespace).
    p.add_argument(
        "--broker",
        default=DEFAULT_BROKER if here else argparse.SUPPRESS,
        metavar="HOST:PORT",
        help=f"the broker to talk to (default: {DEFAULT_BROKER})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT if here else argparse.SUPPRESS,
        help=f"seconds to wait for a reply (default: {DEFAULT_TIMEOUT})",
    )
    p.add_argument(
        "--key",
        dest="udp_key",  # "key" is the bind verb's binding key
        default=None if here else argparse.SUPPRESS,
        metavar="HEX",
        help="the broker's shared key in hex: every cmq datagram is tagged with it, and a broker "
        "started with a key drops what is not (default: none, no authentication on UDP)",
    )
    p.add_argument(
        "--key-file",
        dest="udp_key_file",
        type=Path,
        default=None if here else argparse.SUPPRESS,
        metavar="FILE",
        help="read the shared key (raw bytes) from FILE",
    )


def _key(args: argparse.Namespace) -> bytes | None:
    """The shared key from ``--key`` or ``--key-file`` (None: neither).

    Raises:
        ConfigError: both given, not hexadecimal, or the file cannot be read.
    """
    from cmq.commands._common import key_option

    return key_option(args.udp_key, args.udp_key_file)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the serve options and the client verbs to ``parser``."""
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="UDP port to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--consumer-timeout",
        type=float,
        default=None,
        help="seconds of silence before a consumer is detached",
    )
    parser.add_argument(
        "--ack-timeout",
        type=float,
        default=None,
        help="seconds before an unacknowledged delivery is requeued",
    )
    parser.add_argument(
        "--spin-us",
        type=float,
        default=None,
        help="microseconds to keep polling for the next message after one before "
        "sleeping, on the cmq and the AMQP port (default 100; 0 sleeps at once: "
        "less CPU, slower round trips)",
    )
    parser.add_argument(
        "--amqp-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve AMQP 0-9-1 over TCP on this port (off by default; 0: any free port), "
        "in front of the same exchanges and queues; needs pamqp (pip install 'pycmq[broker]')",
    )
    parser.add_argument(
        "--amqps-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve AMQP over TLS (amqps; RabbitMQ's is 5671) on this port, with the "
        "same logins; needs --amqp-port and --tls-cert",
    )
    parser.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="the TLS certificate chain of --amqps-port (PEM)",
    )
    parser.add_argument(
        "--tls-key",
        default=None,
        metavar="FILE",
        help="its private key (PEM; default: in the --tls-cert file)",
    )
    parser.add_argument(
        "--memory-budget",
        type=int,
        default=None,
        metavar="BYTES",
        help="message bytes the broker may hold before AMQP publishers are blocked (connection.blocked, "
        "their sockets no longer read) and cmq publishes are refused (resource-error) until consumers "
        "bring it under 90%% of this "
        "(default: 40%% of the machine's memory, as RabbitMQ)",
    )
    parser.add_argument(
        "--users",
        default=None,
        metavar="FILE",
        help="who may log in over AMQP and what each may do: one 'name:password' a line ('#' "
        "comments; each may do everything), or RabbitMQ's definitions JSON (rabbitmqctl "
        "export_definitions: hashed passwords, tags, configure/write/read permissions on '/'); "
        "read again on SIGHUP, for logins from then on; "
        "without it, only guest/guest from a loopback address (RabbitMQ's default)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve the management console (/console/) and Prometheus /metrics over HTTP "
        "on this port (off by default; 0: any free port); the console asks for one of the "
        "--users (guest/guest from loopback by default)",
    )
    parser.add_argument(
        "--http-host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address of the HTTP port (default: %(default)s)",
    )
    parser.add_argument(
        "--http-allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host header name on the HTTP port too, besides IP addresses, "
        "localhost and --http-host (repeatable; a defence against DNS rebinding)",
    )
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help="where durable exchanges and queues, their bindings and persistent messages are kept "
        "(SQLite, fsynced before a confirm), taken back when a broker starts there again "
        "(default: %(default)s; one broker per directory)",
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="keep nothing on disk: durable queues and persistent messages are gone when the broker stops",
    )
    _client_args(parser, here=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    p = verbs.add_parser("declare-exchange", help="declare an exchange (idempotent)")
    p.add_argument("name")
    p.add_argument(
        "--type", default="direct", help="direct, fanout, topic or headers (default: %(default)s)"
    )
    p.add_argument("--durable", action="store_true", help="keep it across restarts (the broker's --data-dir)")
    _client_args(p)

    p = verbs.add_parser("delete-exchange", help="delete an exchange and its bindings")
    p.add_argument("name")
    _client_args(p)

    p = verbs.add_parser("declare-queue", help="declare a bounded queue (idempotent)")
    p.add_argument("name")
    p.add_argument("--max-length", type=int, default=None, help="most ready messages")
    p.add_argument("--durable", action="store_true",
                   help="keep it, its bindings to durable exchanges and its persistent messages "
                   "across restarts (the broker's --data-dir)")  # fmt: skip
    p.add_argument(
        "--overflow",
        default="drop-head",
        help="what a full queue does: drop-head (drop or dead-letter the oldest), reject-publish "
        "(refuse the newcomer: a confirmed publish fails) or reject-publish-dlx (and dead-letter "
        "it); drop-old, reject and drop-new are older names (default: %(default)s)",
    )
    p.add_argument("--dead-letter-exchange", default=None, metavar="EXCHANGE",
                   help="where rejected, expired and overflowed messages go")  # fmt: skip
    p.add_argument("--dead-letter-routing-key", default=None, metavar="KEY",
                   help="their routing key there (default: their own)")  # fmt: skip
    p.add_argument("--message-ttl", type=float, default=None, metavar="SECONDS",
                   help="how long a message may wait in the queue")  # fmt: skip
    p.add_argument("--expires", type=float, default=None, metavar="SECONDS",
                   help="delete the queue, with its messages, once unused this long "
                        "(no consumer, no declare or get of it)")  # fmt: skip
    p.add_argument("--max-length-bytes", type=int, default=None, metavar="BYTES",
                   help="the body bytes its ready messages may hold; past it --overflow applies, "
                        "as past --max-length")  # fmt: skip
    p.add_argument("--max-priority", type=int, default=None, metavar="N",
                   help="a priority queue: ready messages go highest --priority first (1-255)")  # fmt: skip
    _client_args(p)

    p = verbs.add_parser("delete-queue", help="delete a queue, its bindings and messages")
    p.add_argument("name")
    _client_args(p)

    p = verbs.add_parser("purge", help="drop a queue's ready messages")
    p.add_argument("name")
    _client_args(p)

    for verb, text in (("bind", "bind a queue to an exchange"), ("unbind", "remove a binding")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("queue")
        p.add_argument("exchange")
        p.add_argument(
            "key", nargs="?", default="", help="binding key (topic: '*' one word, '#' any)"
        )
        _client_args(p)

    p = verbs.add_parser("publish", help="publish messages (arguments, or stdin lines with '-')")
    p.add_argument("exchange")
    p.add_argument("routing_key")
    p.add_argument(
        "body", nargs="*", help="message bodies, sent as strings ('-': one per stdin line)"
    )
    p.add_argument("--json", action="store_true", help="parse each body as JSON")
    p.add_argument(
        "--confirm", action="store_true", help="wait for the broker to route each message"
    )
    p.add_argument("--persistent", action="store_true",
                   help="kept on disk in durable queues until acknowledged (AMQP's delivery_mode 2)")  # fmt: skip
    p.add_argument("--priority", type=int, default=None, metavar="N",
                   help="the messages' priority (0-255), for queues made with --max-priority")  # fmt: skip
    _client_args(p)

    p = verbs.add_parser("consume", help="print deliveries from a queue, one per line")
    p.add_argument("queue")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    p.add_argument("--wait", type=float, default=None, help="stop after this many idle seconds")
    p.add_argument("--no-ack", action="store_true", help="at most once, no acknowledgements")
    p.add_argument("--prefetch", type=int, default=256)
    _client_args(p)

    p = verbs.add_parser("stats", help="print the broker's counters as JSON")
    _client_args(p)

    p = verbs.add_parser("bench", help="TE-SPSC (1 vs 1024 bindings) and DE-SPSC against RabbitMQ")
    p.add_argument("--seconds", type=float, default=1.5,
                   help="length of each measurement (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--repeat", type=int, default=2, help="interleaved runs, best kept (default: %(default)s)"
    )
    p.add_argument("--size", type=int, default=16, help="message body bytes (default: %(default)s)")
    p.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                   help="the RabbitMQ measured beside; skipped with a line when it does not answer "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the results as JSON")

    p = verbs.add_parser(
        "bench-durable",
        help="confirmed persistent publishes per second (confirm each, and a window) with one "
        "consumer beside, beside transient ones and RabbitMQ's",
    )
    p.add_argument("--seconds", type=float, default=2.0,
                   help="length of each measurement (default: %(default)s)")  # fmt: skip
    p.add_argument("--size", type=int, default=1024, help="message body bytes (default: %(default)s)")
    p.add_argument("--window", type=int, default=256, help="confirmed publishes in flight (default: %(default)s)")
    p.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                   help="the RabbitMQ measured beside; skipped with a line when it does not answer "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the results as JSON")

    p = verbs.add_parser(
        "hash-password",
        help="print a password as RabbitMQ's definitions keep it (password_hash), for a --users file",
        description="Read a password (asked twice on a terminal, else the first line of standard "
        "input) and print it salted and hashed as RabbitMQ keeps it, for the \"password_hash\" of a "
        "user in a definitions file (--users): "
        '{"name": "app", "password_hash": "<printed>", "hashing_algorithm": '
        '"rabbit_password_hashing_sha256", "tags": []}. Talks to no broker.',
    )
    p.add_argument("--algorithm", choices=["sha256", "sha512", "md5"], default="sha256",
                   help="the digest (default: %(default)s, RabbitMQ's; the file's hashing_algorithm is "
                   "rabbit_password_hashing_ALGORITHM)")  # fmt: skip


def _hash_password(args: argparse.Namespace) -> int:
    import getpass

    from cmq.routing._users import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise ConfigError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    print(hash_password(password, f"rabbit_password_hashing_{args.algorithm}"))
    return 0


def _reload_users(users: Users, path: str) -> None:
    """SIGHUP: read the users file again (new logins see it); a bad file keeps the users there were."""
    try:
        notes = users.reload()
    except ConfigError as exc:
        print(f"cmq broker: {path}: not reloaded, the users before stay: {exc}", file=sys.stderr, flush=True)
        return
    print(f"cmq broker: {path}: reloaded, {len(users)} user(s)", file=sys.stderr, flush=True)
    for note in notes:
        print(f"cmq broker: {path}: {note}", file=sys.stderr, flush=True)


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        return value
    return json.dumps(value, default=repr)


def _serve(args: argparse.Namespace) -> int:
    import logging

    from cmq.routing import Broker, BrokerConfig

    # What the broker refuses or drops is logged (rate-limited) to stderr.
    logging.basicConfig(level=logging.WARNING, format="cmq broker: %(message)s", stream=sys.stderr)

    options: dict[str, Any] = {}
    if args.consumer_timeout is not None:
        options["consumer_timeout"] = args.consumer_timeout
    if args.ack_timeout is not None:
        options["ack_timeout"] = args.ack_timeout
    if args.spin_us is not None:
        options["spin"] = args.spin_us * 1e-6
    if args.memory_budget is not None:
        options["memory_budget"] = args.memory_budget
    users = None
    if args.users is not None:
        if args.amqp_port is None and args.http_port is None:
            raise ConfigError("--users is for the AMQP listener and the console: "
                              "give --amqp-port or --http-port too")  # fmt: skip
        from cmq.routing._users import Users

        users = Users.load(args.users)
        for note in users.notes:
            print(f"cmq broker: {args.users}: {note}", file=sys.stderr)
    tls = None
    if args.amqps_port is not None or args.tls_cert is not None or args.tls_key is not None:
        if args.amqps_port is None or args.tls_cert is None:
            raise ConfigError("AMQP over TLS needs --amqps-port and --tls-cert (and --tls-key unless "
                              "the key is in the certificate's file)")  # fmt: skip
        if args.amqp_port is None:
            raise ConfigError("--amqps-port serves beside the AMQP listener: give --amqp-port too")
        from cmq.routing import tls_context

        tls = tls_context(args.tls_cert, args.tls_key)
    data_dir = None if args.in_memory else args.data_dir
    broker = Broker(port=args.port, host=args.host, config=BrokerConfig(**options),
                    amqp_port=args.amqp_port, users=users, data_dir=data_dir, key=_key(args),
                    amqps_port=args.amqps_port, tls=tls)  # fmt: skip
    # Only set a flag here: closing from a signal handler could interrupt the
    # endpoint while it holds its own locks.
    signal.signal(signal.SIGTERM, lambda *_: broker.stop())
    if users is not None:
        signal.signal(signal.SIGHUP, lambda *_: _reload_users(users, args.users))
    http = None
    if args.http_port is not None:
        try:
            require("the console", "starlette", "uvicorn", "jinja2")
        except MissingExtra:
            broker.close()
            raise
        from cmq.console import BrokerHttp

        try:
            store = "memory (nothing kept)" if data_dir is None else f"sqlite in {data_dir}"
            http = BrokerHttp(broker, host=args.http_host, port=args.http_port, users=users,
                              store_name=store,
                              allow_hosts=frozenset(args.http_allow_host)).start()  # fmt: skip
        except BaseException:
            broker.close()
            raise
    host, port = broker.address
    amqp = broker.amqp_address
    also = f", AMQP 0-9-1 on {amqp[0]}:{amqp[1]}" if amqp is not None else ""
    amqps = broker.amqps_address
    if amqps is not None:
        also += f", AMQP over TLS on {amqps[0]}:{amqps[1]}"
    if http is not None:
        h, p = http.address
        also += f", console on http://{h}:{p}/console/"
    print(f"cmq broker serving on {host}:{port}{also}", flush=True)
    try:
        broker.serve_forever()
    finally:
        if http is not None:
            http.close()
        broker.close()
    return 0


def _client_verb(args: argparse.Namespace) -> int:
    from cmq.routing import BrokerClient

    with BrokerClient(args.broker, timeout=args.timeout, key=_key(args)) as client:
        verb = args.verb
        if verb == "declare-exchange":
            created = client.declare_exchange(args.name, args.type, durable=args.durable)
            print(f"exchange {args.name!r} ({args.type}) {'created' if created else 'exists'}")
        elif verb == "delete-exchange":
            print(
                f"exchange {args.name!r} {'deleted' if client.delete_exchange(args.name) else 'did not exist'}"
            )
        elif verb == "declare-queue":
            options: dict[str, Any] = {
                "overflow": args.overflow,
                "dead_letter_exchange": args.dead_letter_exchange,
                "dead_letter_routing_key": args.dead_letter_routing_key,
                "message_ttl": args.message_ttl,
                "expires": args.expires,
                "max_length_bytes": args.max_length_bytes,
                "max_priority": args.max_priority,
                "durable": args.durable,
            }
            if args.max_length is not None:
                options["max_length"] = args.max_length
            info = client.declare_queue(args.name, **options)
            state = "created" if info["created"] else "exists"
            print(
                f"queue {args.name!r} {state}: {info['messages']} messages, {info['consumers']} consumers"
            )
        elif verb == "delete-queue":
            print(f"queue {args.name!r} deleted with {client.delete_queue(args.name)} messages")
        elif verb == "purge":
            print(f"queue {args.name!r}: {client.purge_queue(args.name)} messages purged")
        elif verb in ("bind", "unbind"):
            changed = getattr(client, verb)(args.queue, args.exchange, args.key)
            print(
                f"{verb} {args.queue!r} {args.exchange!r} {args.key!r}: {'done' if changed else 'no change'}"
            )
        elif verb == "publish":
            return _publish(client, args)
        elif verb == "consume":
            return _consume(client, args)
        elif verb == "stats":
            print(json.dumps(client.stats(), indent=2, sort_keys=True))
    return 0


def _publish(client: BrokerClient, args: argparse.Namespace) -> int:
    texts = args.body
    if texts == ["-"]:
        texts = [line.rstrip("\n") for line in sys.stdin]
    messages = [(args.exchange, args.routing_key, json.loads(t) if args.json else t) for t in texts]
    routed = 0
    if args.confirm:
        results = client.publish_many(messages, persistent=args.persistent, priority=args.priority)
        errors = [r for r in results if isinstance(r, RemoteError)]
        routed = sum(r for r in results if isinstance(r, int))
    else:
        for exchange, key, body in messages:
            client.publish(exchange, key, body, persistent=args.persistent, priority=args.priority)
        # One round trip: refusals the broker sent before its answer are in.
        client.stats()
        errors = client.errors()
    # The refusals first, and "published" only for what the broker took.
    for exc in errors:
        print(f"cmq broker publish: {exc}", file=sys.stderr)
    if errors:
        print(f"cmq broker publish: {len(errors)} of {len(messages)} message(s) refused", file=sys.stderr)
        return 1
    where = f", routed to {routed} queue(s) in all" if args.confirm else ""
    print(f"published {len(messages)} message(s){where}", file=sys.stderr)
    return 0


def _consume(client: BrokerClient, args: argparse.Namespace) -> int:
    n = 0
    with client.consume(args.queue, prefetch=args.prefetch, no_ack=args.no_ack) as consumer:
        while not args.count or n < args.count:
            try:
                d = consumer.get(timeout=args.wait)
            except Timeout:
                break
            print(f"{d.routing_key}\t{_show(d.body)}", flush=True)
            n += 1
    return 0


def run(args: argparse.Namespace) -> int:
    """Serve (no verb) or run one client verb; return the exit status.

    Raises:
        CmqError: the broker refused a request or did not answer (the ``cmq``
            command prints it and exits with 1).
    """
    if args.verb is None:
        return _serve(args)
    if args.verb == "bench":
        from cmq.lab.bench.broker import main as bench

        return bench(args)
    if args.verb == "bench-durable":
        from cmq.lab.bench.broker_durable import main as bench_durable

        return bench_durable(args)
    if args.verb == "hash-password":
        return _hash_password(args)
    return _client_verb(args)
