"""Exchanges: pure AMQP 0-9-1 routing (direct, fanout, topic, headers).

Theory of operation
-------------------
An exchange holds *bindings* ``(queue, binding_key)`` and answers one
question: given a message's routing key, which queues get a copy? The answer
is a set, so a queue that several bindings select still gets the message once
(AMQP 0-9-1, section 3.1.3).

=========  ===============================================================
type       a binding ``(queue, key)`` selects a message when ...
=========  ===============================================================
direct     ``routing_key == key``
fanout     always (the key is ignored)
topic      the words of ``routing_key`` match the pattern ``key``, where
           ``*`` is exactly one word and ``#`` is zero or more words
headers    the message's headers match the binding's arguments (the routing
           key is ignored): ``x-match`` ``all`` (the default) wants every
           argument, ``any`` at least one; an argument whose value is void
           (None) asks only that the header be present; arguments named
           ``x-...`` are ignored unless ``x-match`` is ``all-with-x`` or
           ``any-with-x`` (RabbitMQ's rules, ``all`` with no arguments
           matching every message and ``any`` none)
=========  ===============================================================

A headers binding is told apart by its key *and* its arguments (two bindings
of one queue with different arguments are two bindings), so its arguments
travel inside its key: :func:`headers_binding_key` makes the one string, the
exchange reads the arguments back. Everything that keeps or removes bindings
(the broker's tables, the store) handles them as any other key.

Words are the parts of a key split on ``.``. As in RabbitMQ, the empty key has
*zero* words, and every other key has ``key.count(".") + 1`` words, some of
which may be empty (``"a..b"`` is ``a``, ``""``, ``b``). So ``#`` matches every
routing key, ``*`` matches ``"x"`` but not ``""`` (zero words) nor ``"x.y"``,
and ``*.*`` matches ``"."`` (two empty words).

Topic routing cost. The Qpid broker measured in the AMQP paper scanned its
bindings per message and lost rate as they grew. Here topic bindings live in a
trie keyed by word, with the wildcards as separate edges, and a message walks
the trie once, carrying the set of live nodes (a simulated NFA): the work
grows with the routing key's length and with the number of *wildcard* patterns
alive along that path, never with the number of literal bindings that do not
match. Each step is remembered, so the sets of live nodes become the states of
a DFA built lazily: once a key's words have been seen, routing it is one dict
lookup per word, whatever the patterns. Direct and fanout are a dict lookup
and a set.

Nothing here reads a clock, a socket or the broker's state: it is data in,
queue names out.
"""

from __future__ import annotations

import abc
import base64
import enum
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from cmq._errors import ConfigError

__all__ = [
    "Binding",
    "DirectExchange",
    "Exchange",
    "ExchangeType",
    "FanoutExchange",
    "HeadersExchange",
    "TopicExchange",
    "headers_binding_key",
    "headers_match",
    "make_exchange",
    "split_key",
    "topic_matches",
]

_EMPTY: frozenset[str] = frozenset()


class ExchangeType(enum.StrEnum):
    """The exchange types cmq's broker knows (AMQP 0-9-1 names)."""

    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """One binding: messages the exchange selects with ``key`` go to ``queue``."""

    queue: str
    key: str


def split_key(key: str) -> tuple[str, ...]:
    """Split a routing or binding key into words (``""`` has zero words)."""
    return tuple(key.split(".")) if key else ()


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Return True when topic binding key ``pattern`` selects ``routing_key``.

    A direct, readable definition used as the reference for the trie (and
    handy for one-off checks); :class:`TopicExchange` never calls it.
    """
    pat, words = split_key(pattern), split_key(routing_key)
    # memo[i][j]: does pat[i:] match words[j:]? Filled right to left, so
    # "#.#.#" patterns stay polynomial.
    n, m = len(pat), len(words)
    memo = [[False] * (m + 1) for _ in range(n + 1)]
    memo[n][m] = True
    for i in range(n - 1, -1, -1):
        for j in range(m, -1, -1):
            p = pat[i]
            if p == "#":
                memo[i][j] = memo[i + 1][j] or (j < m and memo[i][j + 1])
            elif j < m and (p == "*" or p == words[j]):
                memo[i][j] = memo[i + 1][j + 1]
    return memo[0][0]


class Exchange(abc.ABC):
    """Bindings of one exchange and the routing rule of its type.

    ``route`` returns a read-only set; callers must not keep or mutate it
    across a later ``bind``/``unbind`` (direct and fanout hand out their own
    set to avoid a copy per message).
    """

    type: ExchangeType

    def __init__(self) -> None:
        self._bindings: dict[Binding, None] = {}  # insertion-ordered set

    def bind(self, queue: str, key: str = "") -> bool:
        """Add a binding; return False if it already existed (idempotent)."""
        b = Binding(queue=queue, key=key)
        if b in self._bindings:
            return False
        self._bindings[b] = None
        self._add(queue, key)
        return True

    def unbind(self, queue: str, key: str = "") -> bool:
        """Remove a binding; return False if there was none (not an error)."""
        b = Binding(queue=queue, key=key)
        if b not in self._bindings:
            return False
        del self._bindings[b]
        self._remove(queue, key)
        return True

    def unbind_queue(self, queue: str) -> int:
        """Remove every binding to ``queue`` (it is being deleted); return how many."""
        gone = [b for b in self._bindings if b.queue == queue]
        for b in gone:
            self.unbind(b.queue, b.key)
        return len(gone)

    def bindings(self) -> list[Binding]:
        """The bindings, oldest first."""
        return list(self._bindings)

    def __len__(self) -> int:
        return len(self._bindings)

    def __iter__(self) -> Iterator[Binding]:
        return iter(list(self._bindings))

    @abc.abstractmethod
    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Set[str]:
        """The queues that get a message with ``routing_key`` (and ``headers``,
        which only a headers exchange looks at), each once."""

    @abc.abstractmethod
    def _add(self, queue: str, key: str) -> None: ...

    @abc.abstractmethod
    def _remove(self, queue: str, key: str) -> None: ...


class DirectExchange(Exchange):
    """Exact match of routing key and binding key."""

    type = ExchangeType.DIRECT

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, set[str]] = {}

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Set[str]:
        return self._by_key.get(routing_key, _EMPTY)

    def _add(self, queue: str, key: str) -> None:
        self._by_key.setdefault(key, set()).add(queue)

    def _remove(self, queue: str, key: str) -> None:
        queues = self._by_key[key]
        queues.discard(queue)
        if not queues:
            del self._by_key[key]


class FanoutExchange(Exchange):
    """Every bound queue, whatever the key."""

    type = ExchangeType.FANOUT

    def __init__(self) -> None:
        super().__init__()
        # A queue bound under two keys is still one destination: count keys.
        self._count: dict[str, int] = {}
        self._queues: set[str] = set()

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Set[str]:
        return self._queues

    def _add(self, queue: str, key: str) -> None:
        self._count[queue] = self._count.get(queue, 0) + 1
        self._queues.add(queue)

    def _remove(self, queue: str, key: str) -> None:
        left = self._count[queue] - 1
        if left:
            self._count[queue] = left
        else:
            del self._count[queue]
            self._queues.discard(queue)


class _Node:
    """A trie node: the pattern prefix spelled by the edges from the root."""

    __slots__ = ("hash", "is_hash", "queues", "star", "words")

    def __init__(self, is_hash: bool) -> None:
        self.words: dict[str, _Node] = {}  # literal word edges
        self.star: _Node | None = None  # the "*" edge
        self.hash: _Node | None = None  # the "#" edge
        self.is_hash = is_hash  # reached by "#": absorbs any further word
        self.queues: set[str] = set()  # bindings whose pattern ends here

    def empty(self) -> bool:
        return not (self.words or self.star or self.hash or self.queues)


def _closure(nodes: set[_Node]) -> set[_Node]:
    """Add the nodes reachable by ``#`` edges taking zero words."""
    todo = [n for n in nodes if n.hash is not None]
    while todo:
        h = todo.pop().hash
        assert h is not None
        if h not in nodes:
            nodes.add(h)
            if h.hash is not None:
                todo.append(h)
    return nodes


class _DState:
    """A state of the lazily built DFA: one set of live trie nodes."""

    __slots__ = ("next", "nodes", "queues")

    def __init__(self, nodes: frozenset[_Node]) -> None:
        self.nodes = nodes
        self.next: dict[str, _DState] = {}  # word -> state, filled as words are seen
        found = [n.queues for n in nodes if n.queues]
        # One matching pattern: share its set (no copy per message).
        self.queues: Set[str] = found[0] if len(found) == 1 else frozenset().union(*found)


# Transitions remembered before the DFA is dropped and rebuilt: keys made of
# ever-new words (order ids, say) must not grow the cache without bound.
MAX_DFA_TRANSITIONS: Final = 65_536


class TopicExchange(Exchange):
    """Pattern match on dot-separated words with a trie (see the module doc).

    The trie is walked as an NFA (a set of live nodes per word), and each
    step taken is remembered: the sets of live nodes become the states of a
    DFA built lazily, so a routing key costs one dict lookup per word once
    its words have been seen, however many patterns (wildcards included) are
    bound. Any bind or unbind drops the DFA; it is rebuilt as keys arrive.
    """

    type = ExchangeType.TOPIC

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(is_hash=False)
        self._reset()

    def _reset(self) -> None:
        self._states: dict[frozenset[_Node], _DState] = {}
        self._transitions = 0
        self._start = self._intern(frozenset(_closure({self._root})))

    def _intern(self, nodes: frozenset[_Node]) -> _DState:
        state = self._states.get(nodes)
        if state is None:
            state = self._states[nodes] = _DState(nodes)
        return state

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Set[str]:
        state = self._start
        for word in routing_key.split(".") if routing_key else ():
            nxt = state.next.get(word)
            if nxt is None:
                nxt = self._step(state, word)
                if self._transitions >= MAX_DFA_TRANSITIONS:
                    self._reset()  # rare: many distinct words; start afresh
                else:
                    state.next[word] = nxt
                    self._transitions += 1
            if not nxt.nodes:
                return _EMPTY
            state = nxt
        return state.queues

    def _step(self, state: _DState, word: str) -> _DState:
        """The NFA step: the live nodes after ``word``, as a DFA state."""
        nxt: set[_Node] = set()
        for node in state.nodes:
            child = node.words.get(word)
            if child is not None:
                nxt.add(child)
            if node.star is not None:
                nxt.add(node.star)
            if node.is_hash:
                nxt.add(node)  # "#" swallows this word too
        return self._intern(frozenset(_closure(nxt)))

    def _add(self, queue: str, key: str) -> None:
        node = self._root
        for word in split_key(key):
            node = self._child(node, word)
        node.queues.add(queue)
        self._reset()

    def _child(self, node: _Node, word: str) -> _Node:
        if word == "#":
            if node.hash is None:
                node.hash = _Node(is_hash=True)
            return node.hash
        if word == "*":
            if node.star is None:
                node.star = _Node(is_hash=False)
            return node.star
        child = node.words.get(word)
        if child is None:
            child = node.words[word] = _Node(is_hash=False)
        return child

    def _remove(self, queue: str, key: str) -> None:
        path = [self._root]
        words = split_key(key)
        for word in words:
            path.append(self._child(path[-1], word))
        path[-1].queues.discard(queue)
        # Prune nodes left with nothing below them, so a churn of bindings
        # does not leave a trie that only grows.
        for i in range(len(words), 0, -1):
            node, parent, word = path[i], path[i - 1], words[i - 1]
            if not node.empty():
                break
            if word == "#":
                parent.hash = None
            elif word == "*":
                parent.star = None
            else:
                del parent.words[word]
        self._reset()


#: The values of ``x-match`` a headers binding may have (RabbitMQ's).
X_MATCH: Final = ("all", "any", "all-with-x", "any-with-x")
# Between a headers binding's routing key and its packed arguments (base64
# never holds it, so the last one splits them whatever the key holds).
_ARGS_SEP: Final = "\x00"


def headers_binding_key(key: str, arguments: Mapping[str, Any] | None) -> str:
    """The one string that names a headers binding: ``key`` and its ``arguments``.

    Raises:
        ConfigError: ``x-match`` is not one of :data:`X_MATCH`, or an
            argument cannot be packed.
    """
    args = dict(arguments or {})
    mode = args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    if mode not in X_MATCH:
        raise ConfigError(f"invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x")
    try:
        packed = msgpack.packb(sorted(args.items()), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"binding arguments cannot be kept: {exc}") from None
    return key + _ARGS_SEP + base64.b64encode(packed).decode("ascii")


def _comparable(v: Any) -> Any:
    # AMQP has one string type on the wire in practice (longstr): text and
    # bytes that spell the same UTF-8 are the same value, as in RabbitMQ.
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v)
    return v


def _same(a: Any, b: Any) -> bool:
    a, b = _comparable(a), _comparable(b)
    if type(a) is bool or type(b) is bool:
        return a is b  # a boolean header is not the number 1
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - odd values simply do not match
        return False


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """Whether a message with ``headers`` matches a headers binding with ``arguments``
    (RabbitMQ's ``headers_match``; see the module's table)."""
    mode = _comparable(arguments.get("x-match", "all"))
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode not in ("any", "any-with-x")  # an unknown value: all, as RabbitMQ
    data = headers if isinstance(headers, Mapping) else {}
    for name, want in arguments.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        ok = name in data and (want is None or _same(want, data[name]))
        if ok and not want_all:
            return True
        if not ok and want_all:
            return False
    return want_all


class HeadersExchange(Exchange):
    """Matches a message's headers against each binding's arguments (linear in
    the bindings, as RabbitMQ's); the routing key is ignored."""

    type = ExchangeType.HEADERS

    def __init__(self) -> None:
        super().__init__()
        # binding key -> (queue, arguments)
        self._specs: dict[tuple[str, str], dict[str, Any]] = {}

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Set[str]:
        out: set[str] = set()
        for (queue, _), args in self._specs.items():
            if queue not in out and headers_match(args, headers):
                out.add(queue)
        return out

    def _add(self, queue: str, key: str) -> None:
        self._specs[(queue, key)] = _arguments_of(key)

    def _remove(self, queue: str, key: str) -> None:
        self._specs.pop((queue, key), None)


def _arguments_of(key: str) -> dict[str, Any]:
    """The arguments inside a headers binding key (none for a plain key)."""
    _, sep, packed = key.rpartition(_ARGS_SEP)
    if not sep:
        return {}
    try:
        pairs = msgpack.unpackb(base64.b64decode(packed), raw=False)
        return {str(k): v for k, v in pairs}
    except Exception:  # noqa: BLE001 - a key not made by headers_binding_key: no arguments
        return {}


_TYPES: dict[ExchangeType, type[Exchange]] = {
    ExchangeType.DIRECT: DirectExchange,
    ExchangeType.FANOUT: FanoutExchange,
    ExchangeType.TOPIC: TopicExchange,
    ExchangeType.HEADERS: HeadersExchange,
}


def make_exchange(type_name: str) -> Exchange:
    """Return a new, empty exchange of ``type_name`` ("direct", "fanout", "topic", "headers").

    Raises:
        ConfigError: ``type_name`` is not a known exchange type.
    """
    try:
        kind = ExchangeType(type_name)
    except ValueError:
        known = ", ".join(t.value for t in ExchangeType)
        raise ConfigError(f"unknown exchange type {type_name!r} (known: {known})") from None
    return _TYPES[kind]()
