"""Configuration of ``cmq serve``: one frozen, validated dataclass per part."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from cmq._errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SCHEDULING",
    "DEFAULT_SQLITE_PATH",
    "MAX_REQUEST_BYTES",
    "SCHEDULING_POLICIES",
    "ServiceConfig",
    "StoreConfig",
]

#: ElasticMQ's and most SQS emulators' port, so existing local setups work.
DEFAULT_PORT = 9324
#: The embedded default store: one file under ./cmq-data/.
DEFAULT_SQLITE_PATH = os.path.join("cmq-data", "cmq.sqlite3")
#: Hard cap on an HTTP request body. SQS caps a message, and a whole batch, at
#: 1 MiB, but JSON escaping can blow a valid 1 MiB body up to 6x (\u0001 for
#: one byte), so leave room before refusing unread.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: How a node's threads ask Linux to schedule them (see
#: :func:`cmq.service.server.apply_scheduling`): ``batch`` (SCHED_BATCH) or
#: ``normal`` (SCHED_OTHER, what every process gets unless it asks).
SCHEDULING_POLICIES = ("batch", "normal")
#: ``batch``: a node's threads hand work to one another several times a
#: request (event loop, SQLite writer, fsync thread) and, woken, would each
#: preempt whatever runs on that core; as batch threads they wait for the
#: running one's turn to end instead. With four nodes and their load on two
#: cores that cut a cycle's CPU by 12-31 % (the queue service guide's
#: Throughput section); on idle cores a woken thread runs at once either way.
DEFAULT_SCHEDULING = "batch"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Where queues live, parsed from a store URL.

    - ``memory:`` in-process (one worker; the test double);
    - ``sqlite:PATH`` or ``sqlite:///ABS/PATH`` (default
      ``./cmq-data/cmq.sqlite3``), options ``?synchronous=full|normal``;
    - ``redis-cluster://host:port,host:port`` with options
      ``?wait_replicas=N&wait_timeout_ms=T`` (default: wait for 1 replica when
      the master has any, for up to 1000 ms).
    """

    kind: str
    """``memory``, ``sqlite`` or ``redis-cluster``."""
    path: str = DEFAULT_SQLITE_PATH
    """SQLite database file."""
    synchronous: str = "full"
    """``full``: a request is answered only after an fsync of the WAL that
    followed its commit (power-loss safe; the store's syncer thread does the
    fsync, see :mod:`cmq.service.store.sqlite`); ``normal``: answered after
    the commit, which survives a killed process but not the OS."""
    nodes: tuple[tuple[str, int], ...] = ()
    """Redis Cluster seed nodes."""
    wait_replicas: int = 1
    """Acknowledge a send only once this many replicas have it (capped at the
    replicas the master actually has)."""
    wait_timeout_ms: int = 1000
    """How long ``WAIT`` may take before a send fails with a 503."""

    def __post_init__(self) -> None:
        if self.kind not in ("memory", "sqlite", "redis-cluster"):
            raise ConfigError(f"unknown store kind {self.kind!r}")
        if self.synchronous not in ("full", "normal"):
            raise ConfigError(f"synchronous must be full or normal, not {self.synchronous!r}")
        if self.kind == "redis-cluster" and not self.nodes:
            raise ConfigError("redis-cluster:// needs at least one host:port")
        if self.wait_replicas < 0 or self.wait_timeout_ms < 1:
            raise ConfigError("wait_replicas must be >= 0 and wait_timeout_ms >= 1")

    @classmethod
    def from_url(cls, url: str) -> StoreConfig:
        """Parse a store URL. Raises ConfigError."""
        scheme, _, rest = url.partition(":")
        rest, _, query = rest.partition("?")
        opts = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            if scheme == "memory":
                return cls(kind="memory")
            if scheme == "sqlite":
                path = rest[2:] if rest.startswith("//") else rest
                return cls(
                    kind="sqlite",
                    path=path or DEFAULT_SQLITE_PATH,
                    synchronous=opts.get("synchronous", "full"),
                )
            if scheme == "redis-cluster":
                nodes = []
                for part in urlsplit(url).netloc.split(","):
                    host, _, port = part.rpartition(":")
                    nodes.append((host or "127.0.0.1", int(port)))
                return cls(
                    kind="redis-cluster",
                    nodes=tuple(nodes),
                    wait_replicas=int(opts.get("wait_replicas", "1")),
                    wait_timeout_ms=int(opts.get("wait_timeout_ms", "1000")),
                )
        except ValueError as exc:
            raise ConfigError(f"bad store URL {url!r}: {exc}") from exc
        raise ConfigError(
            f"bad store URL {url!r}: expected memory:, sqlite:PATH or redis-cluster://host:port,..."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Options of one ``cmq serve`` node."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = DEFAULT_PORT
    """Port to listen on (0 picks a free one)."""
    store: StoreConfig = StoreConfig(kind="sqlite")
    """Where the queues live."""
    workers: int = 1
    """Processes serving the one port (the memory store allows only 1)."""
    region: str = "us-east-1"
    """Region named in queue ARNs."""
    account_id: str = "000000000000"
    """Account named in queue URLs and ARNs."""
    max_request_bytes: int = MAX_REQUEST_BYTES
    """Request bodies above this are refused with a 413 before being read."""
    auth_file: str | None = None
    """File of ``ACCESS_KEY_ID SECRET_ACCESS_KEY`` lines: every request must be
    SigV4-signed by one of them. None: no authentication, loopback clients only
    (unless ``allow_remote_unsigned``)."""
    allow_remote_unsigned: bool = False
    """Without ``auth_file``, serve clients that are not on loopback too."""
    allow_hosts: tuple[str, ...] = ()
    """Host header names accepted besides IP literals, localhost and ``host``."""
    max_header_bytes: int = 64 * 1024
    """Bytes of request line plus headers; more gets 431."""
    max_headers: int = 100
    """Header fields per request; more gets 431."""
    max_queues: int = 10_000
    """Queues the store may hold (0: no bound); CreateQueue past it gets OverLimit."""
    max_queue_messages: int = 1_000_000
    """Messages one queue may hold (0: no bound); sends past it get OverLimit."""
    max_store_bytes: int = 0
    """Bytes the store may hold (0: no bound); sends past it get OverLimit."""
    request_timeout: float = 30.0
    """Seconds a client has to finish a request it started (or to start one on
    a new connection); then 408 and the connection is closed."""
    scheduling: str = DEFAULT_SCHEDULING
    """The Linux scheduling policy of the node's processes and threads:
    ``batch`` or ``normal`` (see :data:`DEFAULT_SCHEDULING`; elsewhere than
    Linux, ignored)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, not {self.port}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, not {self.workers}")
        if self.workers > 1 and self.store.kind == "memory":
            raise ConfigError("the memory store lives in one process: use --workers 1")
        if not (len(self.account_id) == 12 and self.account_id.isdigit()):
            raise ConfigError("account_id must be 12 digits")
        if self.max_request_bytes < 2 * 1024 * 1024:
            raise ConfigError("max_request_bytes must leave room for a 1 MiB message")
        if self.max_header_bytes < 1024 or self.max_headers < 8:
            raise ConfigError("max_header_bytes must be >= 1024 and max_headers >= 8")
        if min(self.max_queues, self.max_queue_messages, self.max_store_bytes) < 0:
            raise ConfigError("max_queues, max_queue_messages and max_store_bytes must be >= 0")
        if not 0 < self.request_timeout <= 3600:
            raise ConfigError("request_timeout must be in (0, 3600] seconds")
        if self.scheduling not in SCHEDULING_POLICIES:
            raise ConfigError(
                f"scheduling must be {' or '.join(SCHEDULING_POLICIES)}, not {self.scheduling!r}"
            )
