"""Benchmarks of the queue service: throughput and the BDQS order experiment.

Both drive the SQS JSON protocol with an asynchronous HTTP load generator
(asyncio, one keep-alive connection per worker, see :class:`_Conn`): boto3
costs about 1 ms of client CPU per call and aiohttp about 0.2 ms, which on
two cores would measure the client, not the server.

- :func:`throughput`: send+receive+delete cycles per second against N
  ``cmq serve`` nodes over one store, and against moto's server (the
  stand-in for SQS) in the same run.
- :func:`order_experiment`: BDQS Figure 2. A queue is filled with numbered
  messages, then T receivers (spread over the nodes) drain it concurrently,
  each receiving one message at a time and deleting it, until every message
  has been received at least once; per queue ``ReceiveMode`` (atomic or
  lock-free) and ``ConsistencyK``. Every receipt becomes one raw record
  (queue, receiver, message sequence number, send and receive ns, receive
  count) for the PySpark pipeline; :func:`summarise` computes the headline
  rates directly:

  * duplication rate: receipts beyond the first of a message, over messages;
  * out-of-order rate: first receipts, in receive-time order, whose sequence
    number is lower than the one received just before (a no-order queue
    scores about one half, as the paper's does).

Every server is a subprocess started here and stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cmq._errors import CmqError, ConfigError
from cmq._extras import install_hint

__all__ = [
    "MOTO_MISSING",
    "NO_ORDER_K",
    "Servers",
    "measure",
    "moto_server",
    "order_experiment",
    "start_cmq",
    "start_moto",
    "summarise",
    "throughput",
    "throughput_matrix",
]

_HEADERS = {
    "Content-Type": "application/x-amz-json-1.0",
    # moto's server routes a request to a service by the credential scope of
    # its (unverified) signature; cmq serve ignores it, as it ignores auth.
    "Authorization": "AWS4-HMAC-SHA256 Credential=bench/20240101/us-east-1/sqs/aws4_request, "
    "SignedHeaders=host, Signature=0",
}
#: "No order": a K no queue in these runs reaches.
NO_ORDER_K = 1_000_000


@dataclass
class Servers:
    """Running server processes and their base URLs."""

    urls: list[str]
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        """Stop every process by PID."""
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


def start_cmq(store: str, nodes: int = 1, workers: int = 1) -> Servers:
    """Start ``nodes`` ``cmq serve`` processes on free ports over ``store``.

    Raises CmqError if a node does not come up.
    """
    urls: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    for _ in range(nodes):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cmq",
                "serve",
                "--port",
                "0",
                "--store",
                store,
                "--workers",
                str(workers),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            Servers(urls, procs).stop()
            raise CmqError(f"cmq serve did not start: {line!r}")
        urls.append(line.split()[-1])
    servers = Servers(urls, procs)
    _wait_http(servers, "/health")
    return servers


#: Why moto's server cannot be started, and how to get it.
MOTO_MISSING = f"moto_server not found: {install_hint('lab')}"


def moto_server() -> str | None:
    """The path of moto's server executable, or None when it is not installed."""
    exe = shutil.which("moto_server") or os.path.join(
        os.path.dirname(sys.executable), "moto_server"
    )
    return exe if os.path.exists(exe) else None


def start_moto() -> Servers:
    """Start moto's server (the SQS stand-in). Raises ConfigError if missing."""
    exe = moto_server()
    if exe is None:
        raise ConfigError(MOTO_MISSING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    servers = Servers([f"http://127.0.0.1:{port}"], [proc])
    _wait_http(servers, "/moto-api/")
    return servers


def _wait_http(servers: Servers, path: str, timeout: float = 30.0) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    for url in servers.urls:
        host, port = url.removeprefix("http://").split(":")
        while True:
            try:
                conn = http.client.HTTPConnection(host, int(port), timeout=2)
                conn.request("GET", path)
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    servers.stop()
                    raise CmqError(f"{url} did not answer within {timeout} s") from None
                time.sleep(0.05)


class _Conn:
    """One keep-alive HTTP/1.1 connection, written by hand.

    aiohttp costs about 0.2 ms of client CPU per request here, more than
    cmq serve spends answering it; on two cores the load generator must be
    lean or it measures itself. Each request is one ``write`` (no Nagle
    stall); a server that closes the connection (moto does, after every
    reply) is reconnected on the next request.
    """

    def __init__(self, base: str) -> None:
        host, _, port = base.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port or 80)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, action: str, body: bytes) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                sock = self.writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert self.reader is not None
            head = (
                f"POST / HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"X-Amz-Target: AmazonSQS.{action}\r\n{_HEADER_LINES}"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            try:
                self.writer.write(head + body)
                status_line = await self.reader.readuntil(b"\r\n")
                headers = await self.reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
                continue
            length, close = 0, False
            for line in headers.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
                elif line.startswith(b"connection:") and b"close" in line:
                    close = True
            data = await self.reader.readexactly(length)
            if close:
                self.close()
            return int(status_line.split()[1]), data
        raise CmqError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class _AioConn:
    """The same interface over aiohttp, for comparison (``--client aiohttp``)."""

    def __init__(self, base: str) -> None:
        import aiohttp

        self.base = base
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=60)
        )

    async def request(self, action: str, body: bytes) -> tuple[int, bytes]:
        headers = {**_HEADERS, "X-Amz-Target": f"AmazonSQS.{action}"}
        async with self.session.post(self.base + "/", data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    def close(self) -> None:
        asyncio.get_running_loop().create_task(self.session.close())


#: Which client class the load generator uses: "raw" (default) or "aiohttp".
CLIENTS: dict[str, type[_Conn] | type[_AioConn]] = {}


_HEADER_LINES = "".join(f"{k}: {v}\r\n" for k, v in _HEADERS.items())


CLIENTS.update(raw=_Conn, aiohttp=_AioConn)


async def _call(conn: _Conn | _AioConn, action: str, params: dict[str, Any]) -> dict[str, Any]:
    status, body = await conn.request(action, json.dumps(params).encode())
    if status != 200:
        raise CmqError(f"{action} -> {status}: {body[:200]!r}")
    result: dict[str, Any] = json.loads(body) if body else {}
    return result


async def _create(conn: _Conn | _AioConn, name: str, k: int | None, mode: str | None = None) -> str:
    params: dict[str, Any] = {"QueueName": name}
    attributes = {}
    if k is not None:
        attributes["ConsistencyK"] = str(k)
    if mode is not None:
        attributes["ReceiveMode"] = mode
    if attributes:
        params["Attributes"] = attributes
    url: str = (await _call(conn, "CreateQueue", params))["QueueUrl"]
    return url


async def _cycles(
    urls: Sequence[str],
    seconds: float,
    concurrency: int,
    client: str = "raw",
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run send+receive+delete cycles for ``seconds``.

    Every worker first runs one cycle that is not counted (connections made,
    and each node's store connections and scripts warmed, so that a run of
    many nodes does not pay more start-up inside its window than a run of
    one), then all start together: ``on_start`` is called just before the
    counted window opens (with ``client="wrk"``, before wrk starts: wrk
    runs no warm-up cycle).
    """
    make = _Conn if client == "wrk" else CLIENTS[client]
    setup = make(urls[0])
    qurl = await _create(setup, f"bench-{uuid.uuid4().hex[:8]}", None)
    setup.close()
    path = qurl.split("/", 3)[3]  # account/name: the same queue through any node
    if client == "wrk":
        from cmq.lab.bench.wrk_load import wrk_cycles

        if on_start is not None:
            on_start()
        return wrk_cycles(urls, f"/{path}", seconds, concurrency, _HEADERS["Authorization"])
    done = 0
    errors = 0
    warmed = 0
    go = asyncio.Event()
    stop = 0.0

    async def cycle(conn: _Conn | _AioConn, q: str, body: str, give_up: float) -> bool:
        await _call(conn, "SendMessage", {"QueueUrl": q, "MessageBody": body})
        while True:
            got = await _call(conn, "ReceiveMessage", {"QueueUrl": q})
            if got.get("Messages"):
                break
            if time.monotonic() >= give_up:
                return False
        handle = got["Messages"][0]["ReceiptHandle"]
        await _call(conn, "DeleteMessage", {"QueueUrl": q, "ReceiptHandle": handle})
        return True

    async def worker(i: int) -> None:
        nonlocal done, errors, warmed, stop
        base = urls[i % len(urls)]
        conn = make(base)
        q = f"{base}/{path}"
        with contextlib.suppress(CmqError, OSError, asyncio.IncompleteReadError):
            await cycle(conn, q, f"warm{i}", time.monotonic() + 5)
        warmed += 1
        if warmed == concurrency:
            if on_start is not None:
                on_start()
            stop = time.monotonic() + seconds
            go.set()
        await go.wait()
        n = 0
        while time.monotonic() < stop:
            try:
                ok = await cycle(conn, q, f"m{i}-{n}", stop + 5)
            except (CmqError, OSError, asyncio.IncompleteReadError):
                errors += 1
                continue
            if not ok:
                break
            n += 1
            done += 1
        conn.close()
        await asyncio.sleep(0)  # let an aiohttp session finish closing

    tasks = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    await go.wait()
    start = time.monotonic()
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    return {
        "cycles": done,
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(done / elapsed, 1),
        "errors": errors,
    }


@dataclass(frozen=True)
class _Cpu:
    """One reading of a process's CPU time, in seconds: ``exact``, the sum of
    its live threads' on-CPU nanoseconds (``/proc/<pid>/task/<tid>/schedstat``),
    and ``ticks``, user+system time from ``/proc/<pid>/stat`` in 10 ms ticks,
    which also counts threads that have ended and reaped children."""

    exact: float
    ticks: float


def _cpu_reading(pid: int) -> _Cpu:
    """The CPU time of ``pid`` so far (zeros for a process that is gone)."""
    ns = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            path = f"/proc/{pid}/task/{tid}/schedstat"
            # A thread that just ended has no file any more.
            with contextlib.suppress(FileNotFoundError), open(path, encoding="ascii") as f:
                ns += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ns = 0
    return _Cpu(ns / 1e9, _stat_cpu_seconds(pid))


def _cpu_used(before: _Cpu, after: _Cpu) -> float:
    """CPU seconds between two readings of one process: the exact figure,
    unless the ticks exceed it by more than two ticks (threads that ended in
    between took their time with them from the exact sum)."""
    exact, ticks = after.exact - before.exact, after.ticks - before.ticks
    return ticks if ticks - exact > 2 / os.sysconf("SC_CLK_TCK") else exact


def _thread_cpu_seconds(task: str) -> float:
    """On-CPU time of one thread (``"PID/task/TID"``), in ns from its schedstat
    as :func:`_cpu_reading` reads them (0 for a thread that is gone)."""
    try:
        with open(f"/proc/{task}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _stat_cpu_seconds(pid: int | str) -> float:
    """User+system CPU of a process and its reaped children (Linux /proc), or of
    one thread (``"PID/task/TID"``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def throughput(
    store_url: str | None,
    *,
    nodes: int = 1,
    seconds: float = 5.0,
    concurrency: int = 64,
    client: str = "raw",
    store_pids: Sequence[int] = (),
) -> dict[str, Any]:
    """Cycles per second against ``nodes`` cmq serve nodes over ``store_url``,
    or against moto's server when ``store_url`` is None: the servers are
    started for this run and stopped after it (see :func:`measure` for
    what is measured)."""
    servers = start_moto() if store_url is None else start_cmq(store_url, nodes)
    try:
        row = measure(servers, seconds=seconds, concurrency=concurrency, client=client,
                      store_pids=store_pids)  # fmt: skip
    finally:
        servers.stop()
    return {"system": "moto" if store_url is None else store_url.split(":")[0], **row}


def measure(
    servers: Servers,
    *,
    nodes: int | None = None,
    seconds: float = 5.0,
    concurrency: int = 64,
    client: str = "raw",
    store_pids: Sequence[int] = (),
) -> dict[str, Any]:
    """Cycles per second against the first ``nodes`` of running ``servers``
    (all of them by default), on a queue of its own.

    Also measures the CPU time the service consumed during the run, read
    per thread from ``/proc/<pid>/task/<tid>/schedstat`` (in ns; from
    ``/proc/<pid>/stat`` for a process one of whose threads ended meanwhile,
    see :class:`_Cpu`) of every node process used (and its children) and of
    ``store_pids``, the store's own processes (the redis-server processes of
    a Redis Cluster; an SQLite store runs inside the nodes): ``node_cpu_s``,
    ``store_cpu_s`` and ``cycles_per_cpu_s`` = cycles / (node + store CPU
    seconds), counted, with the cycles, from when every connection has run
    one warm-up cycle. Nodes not used are idle and not counted. The load
    generator's own CPU is not in that figure; it is
    ``client_cpu_ms_per_cycle`` (this process's CPU for the asyncio clients,
    the wrk processes' for ``client="wrk"``), which shows whether the
    generator, rather than the node, is the bottleneck; and
    ``loop_cpu_ms_per_cycle`` is the nodes' event-loop threads' alone (a
    node's other threads, SQLite's, run beside it), so one core caps a node
    at 1000 / that figure cycles per second. CPU per cycle is
    a figure that other load on the machine disturbs far less than cycles
    per second, and per CPU-second is how linear scaling shows on a machine
    with fewer cores than nodes.
    """
    used = len(servers.urls) if nodes is None else nodes
    urls = servers.urls[:used]
    pids = [p.pid for p in servers.procs[:used]]
    pids += [c for p in pids for c in _children(p)]
    before: dict[int, _Cpu] = {}
    # The event loop's own thread (a node's main thread, tid = pid): the
    # part of a node that one core bounds, whatever its other threads do.
    loops = [f"{p}/task/{p}" for p in pids]
    at_start = {"loop": 0.0, "client": 0.0}

    def read_before() -> None:
        before.update({p: _cpu_reading(p) for p in (*pids, *store_pids)})
        at_start["loop"] = sum(_thread_cpu_seconds(t) for t in loops)
        at_start["client"] = time.process_time()

    result = asyncio.run(_cycles(urls, seconds, concurrency, client, read_before))
    # The load generator's CPU: this process's, or the wrk processes'.
    client_cpu = result.pop("client_cpu_s", time.process_time() - at_start["client"])
    spent = {p: _cpu_used(reading, _cpu_reading(p)) for p, reading in before.items()}
    cpu = sum(spent[p] for p in pids)
    store_cpu = sum(spent[p] for p in store_pids)
    loop_cpu = sum(_thread_cpu_seconds(t) for t in loops) - at_start["loop"]
    total = cpu + store_cpu
    return {
        "nodes": used,
        "concurrency": concurrency,
        "client": client,
        **result,
        "server_cpu_ms_per_cycle": round(cpu * 1000 / max(1, result["cycles"]), 3),
        "client_cpu_ms_per_cycle": round(client_cpu * 1000 / max(1, result["cycles"]), 3),
        "loop_cpu_ms_per_cycle": round(loop_cpu * 1000 / max(1, result["cycles"]), 3),
        "node_cpu_s": round(cpu, 3),
        "store_cpu_s": round(store_cpu, 3),
        "cycles_per_cpu_s": round(result["cycles"] / total, 1) if total > 0 else 0.0,
    }


def throughput_matrix(
    configs: Sequence[tuple[str, int]],
    store_urls: dict[str, str | None],
    *,
    rounds: int = 3,
    seconds: float = 3.0,
    concurrency: int = 64,
    client: str = "raw",
    fresh_sqlite: bool = True,
) -> list[dict[str, Any]]:
    """Interleaved rounds of every (store kind, nodes) config; medians per config.

    Rounds interleave the configs (moto included) so that load from other
    work on the machine falls on all of them alike; ``x_moto`` is each
    median over moto's median from the same rounds.
    """
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(rounds):
        for kind, nodes in configs:
            url = store_urls[kind]
            if kind == "sqlite" and fresh_sqlite:
                with sqlite_store() as fresh:
                    row = throughput(
                        fresh, nodes=nodes, seconds=seconds, concurrency=concurrency, client=client
                    )
            else:
                row = throughput(
                    url, nodes=nodes, seconds=seconds, concurrency=concurrency, client=client
                )
            runs[(kind, nodes)].append(row)
    out = []
    for (kind, nodes), rows in runs.items():
        rates = sorted(r["cycles_per_s"] for r in rows)
        cpus = sorted(r["server_cpu_ms_per_cycle"] for r in rows)
        client_cpus = sorted(r["client_cpu_ms_per_cycle"] for r in rows)
        loop_cpus = sorted(r["loop_cpu_ms_per_cycle"] for r in rows)
        out.append(
            {
                "system": kind,
                "nodes": nodes,
                "rounds": len(rows),
                "cycles_per_s": rates[len(rates) // 2],
                "all_cycles_per_s": rates,
                "server_cpu_ms_per_cycle": cpus[len(cpus) // 2],
                "client_cpu_ms_per_cycle": client_cpus[len(client_cpus) // 2],
                "loop_cpu_ms_per_cycle": loop_cpus[len(loop_cpus) // 2],
                "errors": sum(r["errors"] for r in rows),
            }
        )
    moto = next((r for r in out if r["system"] == "moto"), None)
    if moto is not None:
        for r in out:
            r["x_moto"] = round(r["cycles_per_s"] / moto["cycles_per_s"], 1)
            r["x_moto_cpu"] = round(
                moto["server_cpu_ms_per_cycle"] / max(r["server_cpu_ms_per_cycle"], 1e-9), 1
            )
    return out


async def _order_run(
    urls: Sequence[str],
    system: str,
    t_recv: int,
    k: int | None,
    n: int,
    mode: str | None = None,
    rep: int = 0,
) -> list[dict[str, Any]]:
    setup = _Conn(urls[0])
    name = f"order-{uuid.uuid4().hex[:8]}"
    qurl = await _create(setup, name, k, mode)
    path = qurl.split("/", 3)[3]
    for start in range(0, n, 10):
        now_ns = time.time_ns()
        entries = [
            {"Id": str(i), "MessageBody": json.dumps({"seq": i, "sent_ns": now_ns})}
            for i in range(start, min(n, start + 10))
        ]
        await _call(setup, "SendMessageBatch", {"QueueUrl": qurl, "Entries": entries})
    setup.close()
    records: list[dict[str, Any]] = []
    # Done when every message has been received at least once (a duplicate
    # does not count towards that).
    seen: set[int] = set()

    async def receiver(r: int) -> None:
        base = urls[r % len(urls)]
        conn = _Conn(base)
        q = f"{base}/{path}"
        empty = 0
        while len(seen) < n and empty < 50:
            request_ns = time.time_ns()
            try:
                got = await _call(
                    conn,
                    "ReceiveMessage",
                    {"QueueUrl": q, "AttributeNames": ["ApproximateReceiveCount"]},
                )
            except CmqError:
                # moto's server answers 500 now and then under concurrent
                # receivers (a race inside it): retry, bounded by `empty`.
                empty += 1
                continue
            received_ns = time.time_ns()
            msgs = got.get("Messages", [])
            if not msgs:
                empty += 1
                continue
            empty = 0
            for m in msgs:
                body = json.loads(m["Body"])
                records.append(
                    {
                        "system": system,
                        "queue": name,
                        "k": k if k is not None else 0,
                        "mode": mode or "n/a",
                        "rep": rep,
                        "t_recv": t_recv,
                        "receiver": r,
                        "seq": body["seq"],
                        "send_ns": body["sent_ns"],
                        "request_ns": request_ns,
                        "receive_ns": received_ns,
                        "receive_count": int(m["Attributes"]["ApproximateReceiveCount"]),
                        "message_id": m["MessageId"],
                    }
                )
                with contextlib.suppress(CmqError):  # a failed delete: a duplicate later
                    await _call(
                        conn, "DeleteMessage", {"QueueUrl": q, "ReceiptHandle": m["ReceiptHandle"]}
                    )
                seen.add(body["seq"])
        conn.close()

    await asyncio.gather(*(receiver(r) for r in range(t_recv)))
    return records


def order_experiment(
    system: str,
    *,
    t_recvs: Sequence[int] = (1, 2, 3),
    ks: Sequence[int | None] = (1, 2, 3, NO_ORDER_K),
    n: int = 500,
    nodes: int = 1,
    modes: Sequence[str] = ("atomic",),
    repeats: int = 1,
    progress: Callable[[str], None] | None = None,
    servers: Servers | None = None,
) -> list[dict[str, Any]]:
    """Run BDQS Figure 2 on ``system`` (a store URL, or ``moto``).

    Every (mode, T, K) is run ``repeats`` times, each on a fresh queue, with
    the T receivers spread round-robin over ``nodes`` cmq serve nodes
    (started here and stopped after, unless ``servers`` already run them:
    nodes over ``system``'s store, left running).
    Returns the raw per-receipt records (with ``mode`` and ``rep``). moto
    has no K and no receive mode, so it runs ``repeats`` times per T with
    ``k = 0`` and ``mode = "n/a"`` in the records. ``progress`` is called
    after each run with a label saying which one finished.

    Raises:
        ConfigError: ``moto`` is asked for and moto's server is not installed.
        CmqError: a server does not start or a request fails.
    """
    mode_list: Sequence[str | None] = modes
    own = servers is None
    if system == "moto":
        servers = start_moto() if servers is None else servers
        ks = (None,)
        mode_list = (None,)
        label = "moto"
    else:
        servers = start_cmq(system, nodes) if servers is None else servers
        label = system.split(":")[0]
    records: list[dict[str, Any]] = []
    try:
        for mode in mode_list:
            for t in t_recvs:
                for k in ks:
                    for rep in range(repeats):
                        records += asyncio.run(_order_run(servers.urls, label, t, k, n, mode, rep))
                        if progress is not None:
                            k_label = "n/a" if k is None else "no-order" if k >= NO_ORDER_K else k
                            where = f"{label} {mode}" if mode else label
                            progress(f"{where} T={t} K={k_label} #{rep + 1}")
    finally:
        if own:
            servers.stop()
    return records


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Duplication and out-of-order rates per (system, T, K), from raw records."""
    groups: dict[tuple[str, int, int, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["system"], r["t_recv"], r["k"], r["queue"]), []).append(r)
    out = []
    for (system, t, k, _), rows in sorted(groups.items()):
        rows.sort(key=lambda r: (r["receive_ns"], r["receiver"]))
        first: dict[int, dict[str, Any]] = {}
        for r in rows:
            first.setdefault(r["seq"], r)
        messages = len(first)
        duplicates = len(rows) - messages
        ordered = list(first.values())
        ooo = sum(1 for a, b in itertools.pairwise(ordered) if b["seq"] < a["seq"])
        # The lab pipeline's reading: order within each receiver's own stream.
        per_receiver: dict[int, list[int]] = {}
        for r in rows:
            per_receiver.setdefault(r["receiver"], []).append(r["seq"])
        ooo_rx = sum(
            sum(1 for a, b in itertools.pairwise(seqs) if b < a) for seqs in per_receiver.values()
        )
        pairs_rx = sum(max(0, len(seqs) - 1) for seqs in per_receiver.values())
        out.append(
            {
                "system": system,
                "mode": rows[0].get("mode", "atomic"),
                "t_recv": t,
                "k": "no-order" if k >= NO_ORDER_K else (k or "n/a"),
                "messages": messages,
                "duplication_rate": round(duplicates / messages, 4) if messages else 0.0,
                "out_of_order_rate": round(ooo / max(1, messages - 1), 4),
                "out_of_order_per_receiver": round(ooo_rx / max(1, pairs_rx), 4),
            }
        )
    return out


def lab_rows(records: Sequence[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The records in the lab's ``RECORDS_SCHEMA`` shape (:mod:`cmq.lab.records`).

    ``stream`` is the queue, ``scenario`` names T and K, ``params`` holds them
    as JSON; ``receive_count`` (not in that schema) is dropped, as a
    duplicate there is simply a second row of the same ``(stream, seq)``.
    """
    return [
        {
            "experiment": "bdqs-figure2",
            "run_id": run_id,
            "system": r["system"],
            "scenario": f"T={r['t_recv']},K={'no-order' if r['k'] >= NO_ORDER_K else r['k']}"
            + ("" if r.get("mode", "n/a") == "n/a" else f",{r['mode']}"),
            "params": json.dumps(
                {"t_recv": r["t_recv"], "k": r["k"], "mode": r.get("mode", "n/a")},
                sort_keys=True,
            ),
            "size": 0,
            "seq": r["seq"],
            "send_ns": r["send_ns"],
            "recv_ns": r["receive_ns"],
            "lost": False,
            "round_trip": False,
            "stream": r["queue"],
            "receiver": str(r["receiver"]),
            "request_ns": r.get("request_ns"),
        }
        for r in records
    ]


def write_records(records: Sequence[dict[str, Any]], path: str) -> None:
    """Write raw records as Parquet (pyarrow) or, for a ``.jsonl`` path, JSON lines."""
    if path.endswith(".jsonl"):
        with open(path, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(list(records)), path)


@contextlib.contextmanager
def sqlite_store() -> Iterator[str]:
    """A store URL of a fresh SQLite file, removed afterwards."""
    directory = tempfile.mkdtemp(prefix="cmq-bench-")
    try:
        yield f"sqlite:{directory}/bench.sqlite3"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
