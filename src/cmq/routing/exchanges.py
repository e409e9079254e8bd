"""Exchanges: pure AMQP 0-9-1 routing (direct, fanout, topic).

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
=========  ===============================================================

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
match. Direct and fanout are a dict lookup and a set.

Nothing here reads a clock, a socket or the broker's state: it is data in,
queue names out.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Iterator, Set
from dataclasses import dataclass

from cmq._errors import ConfigError

__all__ = [
    "Binding",
    "DirectExchange",
    "Exchange",
    "ExchangeType",
    "FanoutExchange",
    "TopicExchange",
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
    def route(self, routing_key: str) -> Set[str]:
        """The queues that get a message with ``routing_key``, each once."""

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

    def route(self, routing_key: str) -> Set[str]:
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

    def route(self, routing_key: str) -> Set[str]:
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


class TopicExchange(Exchange):
    """Pattern match on dot-separated words with a trie (see the module doc)."""

    type = ExchangeType.TOPIC

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(is_hash=False)
        self._start: tuple[_Node, ...] = (self._root,)

    def route(self, routing_key: str) -> Set[str]:
        states: Collection[_Node] = self._start
        for word in routing_key.split(".") if routing_key else ():
            nxt: list[_Node] = []
            add = nxt.append
            for node in states:
                child = node.words.get(word)
                if child is not None:
                    add(child)
                    h = child.hash
                    while h is not None:  # "#" may take zero words
                        add(h)
                        h = h.hash
                child = node.star
                if child is not None:
                    add(child)
                    h = child.hash
                    while h is not None:
                        add(h)
                        h = h.hash
                if node.is_hash:
                    add(node)  # "#" swallows this word too
            if not nxt:
                return _EMPTY
            # Deduplicate only when there is more than one live node, which
            # keeps "#.#.#" patterns polynomial; one literal path stays cheap.
            states = nxt if len(nxt) == 1 else dict.fromkeys(nxt)
        found = [node.queues for node in states if node.queues]
        if len(found) == 1:
            return found[0]  # no copy in the common case: one pattern matched
        if not found:
            return _EMPTY
        out: set[str] = set()
        for queues in found:
            out |= queues
        return out

    def _add(self, queue: str, key: str) -> None:
        node = self._root
        for word in split_key(key):
            node = self._child(node, word)
        node.queues.add(queue)
        self._start = tuple(_closure({self._root}))

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
        self._start = tuple(_closure({self._root}))


_TYPES: dict[ExchangeType, type[Exchange]] = {
    ExchangeType.DIRECT: DirectExchange,
    ExchangeType.FANOUT: FanoutExchange,
    ExchangeType.TOPIC: TopicExchange,
}


def make_exchange(type_name: str) -> Exchange:
    """Return a new, empty exchange of ``type_name`` ("direct", "fanout", "topic").

    Raises:
        ConfigError: ``type_name`` is not a known exchange type.
    """
    try:
        kind = ExchangeType(type_name)
    except ValueError:
        known = ", ".join(t.value for t in ExchangeType)
        raise ConfigError(f"unknown exchange type {type_name!r} (known: {known})") from None
    return _TYPES[kind]()
