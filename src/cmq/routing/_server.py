"""The broker driver: :class:`BrokerCore` on a real cmq endpoint and clock.

Theory of operation
-------------------
One loop, one thread. A turn waits for a message on ``BROKER_MAILBOX`` (at
most until the core's next deadline), routes it, fires the core's timer if
due, and pushes what the core wants sent: a request is answered before
anything else is looked at, so an idle broker adds as little as it can to
a round trip. Then, if its read returned at once (the message was
already waiting: a sign of load), it takes what the endpoint and the socket
hold without blocking, up to ``_DRAIN`` messages, and pushes and flushes
what those produce as one batch. That non-blocking read would find nothing
when requests come one at a time (a ping-pong) and cost a system call per
request; under load it is what makes deliveries leave in batches.

After a turn that handled a message, the next turn first polls for a while
(``BrokerConfig.spin``, 100 us by default), yielding the CPU between polls,
and only then blocks: in a request/response through the broker the next
message usually comes within that time, and a broker that was asleep pays a
process wake-up for it (most of a hop on these machines). An idle broker
spends nothing; a busy one rarely polls twice. A broker that may run on one
CPU only does not spin: the process it would wait for needs that CPU. This
poll is the only one: the broker's own endpoint is made with
``QueueConfig.spin=0``. The endpoint's poll stops when a yield lets another
process run on its CPU (right for a ping-pong of two processes on one CPU);
the broker's keeps going, as its clients share the machine with it: with
the endpoint's poll alone, a ping-pong through the broker (DE-PP) took
about 1.4x as long (median round trip, nine alternating pairs of runs).

Nothing one datagram does stops the loop. The core never raises for what
it receives (it counts and notes it); an exception anywhere else in a turn
(a bug) is counted as ``internal_error`` and the loop goes on. What the core
noted (malformed messages, refused bodies, internal errors) and what the
endpoint dropped before the broker saw it (datagrams that are not cmq's,
undecodable payloads) are logged on the ``cmq.broker`` logger, at most
``_LOG_BURST`` lines per reason every ``_LOG_WINDOW`` seconds, the rest
summed up in the next line: a flood of garbage costs a few lines a minute.

Memory. The core raises its memory alarm as a message brings what it holds
to its memory budget; after each turn that received something, the loop
has it look again while the alarm is up (``BrokerCore.turn_memory``: the
exact sum, one step per queue, only then). Over the budget the core
refuses cmq-protocol publishes until consumers bring it back under 90% of
it (the AMQP listener holds AMQP publishers back).

The core is guarded by a lock only so that :meth:`Broker.stats` may be
called from another thread.

Durable state. With a data directory, the core's journal (see
:mod:`cmq.routing._store`) is written and committed, one transaction per
turn, under the lock and before the turn's messages leave: a confirm is
never sent before what it confirms is on disk, and the confirms of a
turn share one fsync. The AMQP listener's thread does the same in its turns.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from cmq._errors import CmqError, ConfigError, MissingExtra, Timeout
from cmq._extras import optional_imports
from cmq.net._sock import yield_cpu
from cmq.routing._client import Endpoint, check_codec
from cmq.routing._core import Address, BrokerConfig, BrokerCore, BrokerStats, Note, Outgoing
from cmq.routing._protocol import BROKER_MAILBOX, DELIVERY_MAILBOX, REPLY_MAILBOX

if TYPE_CHECKING:
    from cmq.routing._amqp_server import AmqpListener
    from cmq.routing._store import Store
    from cmq.routing._users import Users

__all__ = ["Broker", "tls_context"]

_T = TypeVar("_T")

# Messages taken per turn before sending: large enough to batch, small enough
# that deliveries and timers are not starved by a flood of publishes.
_DRAIN: Final = 2048
# Longest wait per turn, so that close() is noticed promptly.
_MAX_WAIT: Final = 0.1
# A read that returns within this found its message waiting (one that
# sleeps takes at least a wake-up; in a ping-pong, at least a hop and the
# peer's turn, about 30 us here): only then does a turn look for more.
# Misjudging either way costs a few microseconds, never a message: the
# next read takes what is left.
_AT_ONCE: Final = 15e-6
#: How often the loop looks up the timers' next deadline.
_RECHECK: Final = 0.01
#: How long closing waits for clients to acknowledge what was sent to them
#: (confirms above all): a live client on loopback acknowledges within a few
#: milliseconds, and a dead one never does, so waiting the endpoint's default
#: 2 s only delays the exit (it was the broker's 2.1 s on SIGTERM). With
#: _MAX_WAIT, the broker exits within 0.5 s of being asked to.
_CLOSE_LINGER: Final = 0.2
#: Log lines per reason per window; what is over is summed up in the next line.
_LOG_BURST: Final = 5
_LOG_WINDOW: Final = 10.0
#: How often the endpoint's drop counters are read (to log what it dropped).
_DROPS_EVERY: Final = 1.0

_log = logging.getLogger("cmq.broker")


class _RateLimitedLog:
    """At most ``burst`` lines per reason per ``window`` seconds (time passed in)."""

    def __init__(self, logger: logging.Logger, burst: int = _LOG_BURST, window: float = _LOG_WINDOW) -> None:
        self._logger = logger
        self._burst = burst
        self._window = window
        # reason -> [window start, lines in it, lines held back since the last one]
        self._state: dict[str, list[float]] = {}

    def log(self, level: int, reason: str, text: str, now: float) -> bool:
        """Log ``text`` unless ``reason`` used its lines this window; whether it was."""
        st = self._state.get(reason)
        if st is None or now - st[0] >= self._window:
            held = int(st[2]) if st is not None else 0
            st = self._state[reason] = [now, 0.0, float(held)]
        if st[1] >= self._burst:
            st[2] += 1
            return False
        st[1] += 1
        held = int(st[2])
        st[2] = 0.0
        if held:
            text += f" (and {held} more like it not logged)"
        self._logger.log(level, "%s", text)
        return True


def _cpus() -> int:
    """The CPUs this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def tls_context(cert: str | os.PathLike[str], key: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A server-side TLS context for :class:`Broker`'s ``tls=``: the
    certificate chain in ``cert`` (PEM) and its private key (in ``key``, or
    in ``cert`` too when None), TLS 1.2 at least.

    Raises:
        ConfigError: a file is missing, unreadable, or not a certificate and
            its key.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(os.fspath(cert), None if key is None else os.fspath(key))
    except FileNotFoundError as exc:
        raise ConfigError(f"TLS: no such file: {exc.filename}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"TLS: cannot use certificate {os.fspath(cert)!r} and key "
                          f"{os.fspath(key) if key is not None else '(in the same file)'!r}: {exc}") from None  # fmt: skip
    return ctx


class Broker:
    """A broker serving on ``host:port`` (``port=0``: an ephemeral port).

    ``serve_forever()`` runs it in this thread; ``start()`` in a daemon
    thread. ``close()`` stops it and closes the endpoint if it is its own.

    With ``amqp_port`` (0: an ephemeral port) it also serves AMQP 0-9-1 over
    TCP on ``host:amqp_port``, in a thread of its own, in front of the same
    exchanges and queues; ``users`` (:class:`~cmq.routing.Users`) says who
    may log in there and what each may do (default: RabbitMQ's
    ``guest``/``guest`` from loopback only, with every permission). Needs pamqp (the
    ``broker`` extra). With ``amqps_port`` and ``tls`` (an
    ``ssl.SSLContext`` for the server side, such as :func:`tls_context`
    makes) it serves AMQP over TLS there too (amqps, RabbitMQ's 5671), in
    the same thread; the logins are the same.

    With ``key`` (1 to 64 bytes) every cmq-protocol datagram is signed and
    checked with it (the endpoints' BLAKE2b tags): clients must be given the
    same key (``BrokerClient(..., key=)``), and what is not signed with it is
    dropped and counted before the broker sees it. Without it the UDP side
    has no authentication. The AMQP side has its own logins (``users``).

    With ``data_dir`` (``cmq broker``'s default is ``./cmq-data``), durable
    exchanges, durable queues, their bindings and the persistent messages in
    durable queues are kept in SQLite there and taken back when a broker
    starts on the same directory; a confirm for a persistent message is sent
    only once it is on disk. ``data_dir=None`` (the default here) keeps
    everything in memory only: ``durable`` and ``persistent`` are accepted
    and nothing survives the process.

    Raises:
        ConfigError: a bad option, or the store in ``data_dir`` cannot be
            opened.
        MissingExtra: ``amqp_port`` is given and pamqp (the ``broker``
            extra) is not installed.
        TransportError: a port is in use.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config: BrokerConfig | None = None,
        endpoint: Endpoint | None = None,
        amqp_port: int | None = None,
        users: Users | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        key: bytes | None = None,
        amqps_port: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        # Delivery failures the endpoint reports (from whichever thread read
        # the receiver's answer), handled by the loop under the lock.
        self._in_doubt: collections.deque[Any] = collections.deque()
        if (amqps_port is None) != (tls is None):
            raise ConfigError("AMQP over TLS needs both amqps_port= and tls= (an ssl.SSLContext)")
        if amqps_port is not None and amqp_port is None:
            raise ConfigError("amqps_port= serves beside the AMQP listener: give amqp_port= too")
        self.store: Store | None = None
        if data_dir is not None:
            from cmq.routing._store import Store

            self.store = Store(data_dir)  # raises ConfigError before any port is taken
        if endpoint is None:
            from cmq.net import Queue

            try:
                # spin=0: the loop polls itself (_spin, BrokerConfig.spin);
                # the endpoint's own poll would only add a second one.
                # on_failure: deliveries the endpoint gave up on (a consumer
                # that restarted, say on the port another had) go back to
                # their queues at the loop's next turn (see _take_in_doubt).
                endpoint = Queue(port=port, host=host, codec="msgpack", linger=_CLOSE_LINGER, key=key, spin=0.0,
                                 on_failure=self._in_doubt.append)  # fmt: skip
                # Nor does a run of empty pops pause it: _spin yields between them itself.
                endpoint._pause_after = 1 << 62
            except BaseException:
                if self.store is not None:
                    self.store.close()
                raise
            self._owns_endpoint = True
        elif key is not None:
            raise ConfigError("key= is for the broker's own endpoint: give the key to the endpoint you pass")
        else:
            check_codec(endpoint)
            self._owns_endpoint = False
        self.endpoint: Endpoint = endpoint
        self.core = BrokerCore(config, endpoint_stats=self._endpoint_stats)
        self.core.epoch = time.time() - time.monotonic()
        if self.store is not None:
            try:
                self.core.restore(self.store.load(), time.monotonic())
            except Exception as exc:
                if self._owns_endpoint:
                    endpoint.close()
                self.store.close()
                raise ConfigError(f"cannot take back the broker's state from {str(self.store.path)!r}: {exc}") from exc
            self.core.persisting = True
        self._lock = threading.Lock()
        # Pushes to the endpoint come from this loop and from the AMQP thread.
        self._send_lock = threading.Lock()
        self.amqp: AmqpListener | None = None
        if amqp_port is not None:
            try:
                with optional_imports("the AMQP listener"):
                    from cmq.routing._amqp_server import AmqpListener
                    from cmq.routing._users import Users
            except MissingExtra:
                if self._owns_endpoint:
                    endpoint.close()
                raise
            try:
                self.amqp = AmqpListener(self.core, self._lock, host=host, port=amqp_port,
                                         users=users if users is not None else Users.default(),
                                         send_udp=self._send_udp, commit=self.commit,
                                         tls=tls, tls_port=amqps_port,
                                         spin=self.core.config.spin if _cpus() > 1 else 0.0)  # fmt: skip
            except CmqError:
                if self._owns_endpoint:
                    endpoint.close()
                raise
        # Set by stop() (safe from a signal handler: one assignment); the
        # loop reads it once per turn.
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._limit = _RateLimitedLog(_log)
        self._drops_seen: dict[str, int] = {}
        self._drops_at = float("-inf")
        # Messages held back while the store cannot be written (see commit).
        self._unsent: list[Any] = []

    @property
    def amqp_address(self) -> Address | None:
        """Where AMQP clients reach the broker, or None when it does not serve AMQP."""
        return self.amqp.address if self.amqp is not None else None

    @property
    def amqps_address(self) -> Address | None:
        """Where AMQP over TLS is served, or None."""
        return self.amqp.tls_address if self.amqp is not None else None

    @property
    def address(self) -> Address:
        """Where clients reach the broker (a wildcard host is given as 127.0.0.1)."""
        host, port = self.endpoint.address[:2]
        return ("127.0.0.1" if host in ("0.0.0.0", "::") else host, port)

    def _endpoint_stats(self) -> dict[str, Any]:
        stats = getattr(self.endpoint, "stats", None)
        if stats is None:
            return {}
        snapshot = stats()
        as_dict = getattr(snapshot, "as_dict", None)
        return dict(as_dict()) if as_dict is not None else dict(snapshot)

    def commit(self) -> bool:
        """Write and commit the core's journal (the caller holds the lock);
        whether nothing is left to write.

        A failed write (a full or failing disk) is counted and logged as an
        internal error, and its records are kept and tried again next turn;
        until one succeeds, the drivers hold back every reply and delivery
        (see :meth:`_release`), so no confirm goes out for what is not on disk.
        """
        core, store = self.core, self.store
        if not core.journal or store is None:
            return True
        try:
            store.write(core.journal)
        except sqlite3.Error as exc:
            core.note_internal_error(exc, None, "writing the store")
            return False
        core.journal.clear()
        return True

    def _outgoing(self, first: list[Any] | None = None) -> list[Any]:
        """What the core wants sent (after ``first``), held back while the
        journal cannot be committed (see :meth:`_release`). Under the lock."""
        out = self.core.messages_to_send()
        if first:
            out = first + out
        if self.core.journal or self._unsent:
            out = self._release(out)
        return out

    def _release(self, out: list[Any]) -> list[Any]:
        """What of ``out`` (and what was held back) may leave now: all of it
        once the journal is committed, else nothing (held back). Under the lock."""
        if self.core.journal and not self.commit():
            self._unsent += out
            return []
        if self._unsent:
            out, self._unsent = self._unsent + out, []
        return out

    def stats(self) -> BrokerStats:
        """A snapshot of the broker's counters."""
        with self._lock:
            return self.core.stats()

    def inspect(self, look: Callable[[BrokerCore], _T]) -> _T:
        """``look(core)`` under the lock, from any thread: for read-only
        views (the management console), which must not change the core."""
        with self._lock:
            return look(self.core)

    def call(self, event: Any, sender: Address) -> Any:
        """Do one request (a :mod:`cmq.routing._protocol` event) for a front
        end in this process, from any thread; return its ``ok`` result.

        What it journals is committed before this returns (as a reply would
        wait for it); deliveries it causes leave with the loop's next turn.

        Raises:
            Refused: the request cannot be done (``code`` says why).
            CmqError: the store could not be written (the request is done in
                memory and will be written with the next turn).
        """
        with self._lock:
            result = self.core.call(event, sender, time.monotonic())
            if self.core.journal and not self.commit():
                raise CmqError("the broker could not write its store; see its log")
            return result

    def serve_forever(self) -> None:
        """Serve until :meth:`stop` or :meth:`close` is called (from another thread or a signal)."""
        ep, core = self.endpoint, self.core
        monotonic = time.monotonic
        amqp = self.amqp
        if amqp is not None and amqp._thread is None:
            amqp.start()
        # With one CPU to run on, the process the broker would wait for
        # needs that CPU: polling would only delay it.
        spin = core.config.spin if _cpus() > 1 else 0.0
        deadline: float | None = None
        recheck = float("-inf")
        spin_until = float("-inf")
        while not self._stopping:
            before = monotonic()
            if before >= recheck:
                # The timers' next deadline, looked up at most every
                # _RECHECK (it walks the consumers): one found later than it
                # is fires at most that late.
                deadline = core.next_deadline()
                recheck = before + _RECHECK
            if deadline is None:
                wait = _MAX_WAIT
            else:
                wait = deadline - before
                if wait > _MAX_WAIT:
                    wait = _MAX_WAIT
                elif wait < 0.0:
                    wait = 0.0
            # Right after a message, poll for the next one a while (see
            # BrokerConfig.spin) before the blocking read.
            first = self._spin(spin_until) if spin_until > before else None
            try:
                if first is None:
                    first = ep.get_message(timeout=wait, mailbox=BROKER_MAILBOX)
            except Timeout:
                first = None
            except CmqError:
                if self._stopped():
                    break  # closed under us
                raise
            now = monotonic()
            try:
                at_once = None
                with self._lock:
                    if first is not None:
                        # A publish handed straight to its consumer comes
                        # back as the delivery to push (a ping-pong's every
                        # message), unless messages are held back.
                        if self._unsent:
                            core.receive(first.payload, first.sender, now)
                        else:
                            at_once = core.receive_at_once(first.payload, first.sender, now)
                        core.turn_memory()
                    fired = deadline is not None and deadline <= now
                    if fired:
                        recheck = float("-inf")
                        core.handle_timer(now)
                    if at_once is None or fired:
                        # The usual turn: all there is (the timers' too, after the delivery).
                        out = self._outgoing(None if at_once is None else [at_once])
                        at_once = None
                if at_once is not None:
                    self._send_one(at_once)
                elif out:
                    self._send(out)
                if first is not None and spin:
                    spin_until = monotonic() + spin
                if first is not None and now - before < _AT_ONCE:
                    # The read returned at once: the message was waiting, so
                    # more may be. After its answer has left, take what came
                    # with it or behind it, and send that as one batch.
                    with self._lock:
                        more = self._take_waiting(now) > 0
                        if more:
                            core.turn_memory()
                            out = self._outgoing()
                    if more and out:
                        self._send(out)
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the broker: counted, logged
                with self._lock:
                    core.note_internal_error(exc, None, "in the broker's loop")
            if self._in_doubt:
                self._take_in_doubt(now)
            if core.notes:
                self._log_notes(now)
            if now >= self._drops_at:
                self._log_drops(now)

    def _spin(self, until: float) -> Any:
        """Poll for a broker message without blocking until ``until``; the
        message, or None. Yields the CPU between polls, so a process that
        is ready to run on this core (a client) runs first."""
        pop, monotonic, pause = self.endpoint.pop_message, time.monotonic, yield_cpu
        while True:
            msg = pop(BROKER_MAILBOX)
            if msg is not None or monotonic() >= until or self._stopping:
                return msg
            pause()

    def _take_waiting(self, now: float) -> int:
        """Route what the endpoint and the socket hold, up to ``_DRAIN``
        messages, without blocking; return how many."""
        ep, receive = self.endpoint, self.core.receive
        n = 0
        while n < _DRAIN:
            msg = ep.pop_message(BROKER_MAILBOX)
            if msg is None:
                break
            receive(msg.payload, msg.sender, now)
            n += 1
        return n

    def _take_in_doubt(self, now: float) -> None:
        """Give back what the deliveries the endpoint gave up on carried (see
        BrokerCore.deliveries_in_doubt), send replies again to a client that
        restarted (its stream starts anew: it gets them this time; a request
        it resends is answered from the reply cache), and send what that
        makes due."""
        failures = self._in_doubt
        again: list[Outgoing] = []
        with self._lock:
            while failures:
                f = failures.popleft()
                if f.mailbox == DELIVERY_MAILBOX:
                    self.core.deliveries_in_doubt(f.dest, f.messages, now)
                elif f.mailbox == REPLY_MAILBOX and f.reason == "peer_reset":
                    again += [Outgoing(dest=f.dest, mailbox=REPLY_MAILBOX, payload=m) for m in f.messages]
            out = self._outgoing(again)
        if out:
            self._send(out)

    def _send(self, out: list[Any]) -> None:
        amqp = self.amqp
        if amqp is not None:
            from cmq.routing._amqp_server import is_amqp

            mine = [o for o in out if is_amqp(o.dest)]
            if mine:
                amqp.post(mine)
                out = [o for o in out if not is_amqp(o.dest)]
                if not out:
                    return
        self._send_udp(out)

    def _send_one(self, o: Outgoing) -> None:
        """:meth:`_send` of the latency path's one delivery, in fewer steps."""
        if self.amqp is not None:
            self._send([o])  # it may be an AMQP consumer's
            return
        with self._send_lock:
            self._push((o,))

    def _send_udp(self, out: list[Any]) -> None:
        with self._send_lock:
            self._push(out)

    def _push(self, out: Sequence[Any]) -> None:
        ep = self.endpoint
        failed = 0
        for o in out:
            try:
                ep.push(o.dest, o.payload, o.mailbox)
            except CmqError:
                # A client that went away must not stop the broker; its
                # consumer expires and its messages are requeued.
                failed += 1
            except Exception as exc:  # noqa: BLE001 - a message the broker made but cannot send: a bug
                failed += 1
                with self._lock:
                    self.core.note_internal_error(exc, o.dest, "sending a message")
        try:
            ep.flush()
        except CmqError:
            failed += 1
        if failed:
            with self._lock:
                self.core.note_send_failed(failed)

    def _log_notes(self, now: float) -> None:
        """Log what the core noted, rate-limited per reason."""
        with self._lock:
            notes: list[Note] = list(self.core.notes)
            self.core.notes.clear()
        for n in notes:
            who = f" from {n.sender[0]}:{n.sender[1]}" if n.sender is not None else ""
            level = logging.ERROR if n.reason == "internal_error" else logging.WARNING
            self._limit.log(level, n.reason, f"{n.reason}{who}: {n.detail}", now)

    def _log_drops(self, now: float) -> None:
        """Log what the endpoint dropped since the last look (datagrams that
        never reached the broker: not cmq's, bad tags, undecodable payloads)."""
        self._drops_at = now + _DROPS_EVERY
        stats = getattr(self.endpoint, "stats", None)
        if stats is None:
            return
        try:
            dropped: Mapping[str, int] = stats().dropped
        except (CmqError, OSError, AttributeError):
            return
        new = {k: v - self._drops_seen.get(k, 0) for k, v in dropped.items() if v > self._drops_seen.get(k, 0)}
        self._drops_seen = dict(dropped)
        if new:
            what = ", ".join(f"{k}: {v}" for k, v in sorted(new.items()))
            self._limit.log(logging.WARNING, "endpoint_dropped",
                            f"the endpoint dropped what it received ({what})", now)  # fmt: skip

    def _stopped(self) -> bool:
        # A method, so that the type checker does not take the flag for the
        # constant the loop condition saw: stop() flips it from elsewhere.
        return self._stopping

    def stop(self) -> None:
        """Ask :meth:`serve_forever` to return (safe from a signal handler)."""
        self._stopping = True

    def start(self) -> Broker:
        """Serve in a daemon thread; return self."""
        self._thread = threading.Thread(target=self.serve_forever, name="cmq-broker", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the endpoint if the broker opened it."""
        self._stopping = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * _MAX_WAIT + 1)
        if self.amqp is not None:
            self.amqp.close()
        if self._owns_endpoint:
            self.endpoint.close()
        store = self.store
        if store is not None:
            with self._lock:
                self.commit()
                store.close()
                self.store = None

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
