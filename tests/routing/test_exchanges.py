"""Routing semantics: tables for the rules and edge cases, properties against a reference."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq import ConfigError
from cmq.routing.exchanges import (
    DirectExchange,
    ExchangeType,
    FanoutExchange,
    TopicExchange,
    headers_binding_key,
    headers_match,
    make_exchange,
    split_key,
    topic_matches,
)

# (binding key, routing key, matches?) -- AMQP 0-9-1 topic rules, RabbitMQ's
# reading of the empty key (zero words) and of empty words.
TOPIC_TABLE = [
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b.c", "a.b.c.d", False),
    ("*", "a", True),
    ("*", "", False),  # "" has zero words; * needs exactly one
    ("*", "a.b", False),
    ("*.b", "a.b", True),
    ("*.b", "b", False),
    ("a.*", "a.", True),  # "a." is "a" and an empty word
    ("*.*", ".", True),
    ("*", ".", False),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("a.#", "a", True),  # # takes zero words
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.b", True),
    ("a.#.b", "a.x", False),
    ("a.#.b", "b.a.b", False),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
    ("a..b", "a.b", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("stock.*.nyse", "stock.ibm.nyse", True),
    ("stock.#", "stock.ibm.nyse", True),
    ("*.ibm.*", "stock.ibm.nyse", True),
    ("*.ibm.*", "ibm.nyse", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_TABLE)
def test_topic_table_reference(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_TABLE)
def test_topic_table_trie(pattern: str, key: str, expected: bool) -> None:
    ex = TopicExchange()
    ex.bind("q", pattern)
    assert set(ex.route(key)) == ({"q"} if expected else set())


@pytest.mark.parametrize(
    ("key", "words"),
    [("", ()), ("a", ("a",)), ("a.b", ("a", "b")), (".", ("", "")), ("a..", ("a", "", ""))],
)
def test_split_key(key: str, words: tuple[str, ...]) -> None:
    assert split_key(key) == words


def test_direct_is_exact_and_deduplicated() -> None:
    ex = DirectExchange()
    assert ex.bind("q1", "k")
    assert not ex.bind("q1", "k")  # idempotent
    ex.bind("q2", "k")
    ex.bind("q3", "other")
    assert set(ex.route("k")) == {"q1", "q2"}
    assert set(ex.route("K")) == set()
    assert set(ex.route("")) == set()
    assert len(ex) == 3


def test_fanout_ignores_key_and_delivers_once() -> None:
    ex = FanoutExchange()
    ex.bind("q1", "a")
    ex.bind("q1", "b")  # two bindings, one destination
    ex.bind("q2")
    assert sorted(ex.route("anything")) == ["q1", "q2"]
    assert ex.unbind("q1", "a")
    assert sorted(ex.route("")) == ["q1", "q2"]  # still bound by "b"
    assert ex.unbind("q1", "b")
    assert sorted(ex.route("")) == ["q2"]
    assert not ex.unbind("q1", "b")


def test_topic_queue_once_when_several_bindings_match() -> None:
    ex = TopicExchange()
    for pattern in ("a.b", "a.*", "#", "a.#", "*.b"):
        ex.bind("q", pattern)
    ex.bind("other", "x.#")
    assert sorted(ex.route("a.b")) == ["q"]


def test_unbind_queue_and_prune() -> None:
    ex = TopicExchange()
    ex.bind("q", "a.#.b")
    ex.bind("q", "a.*")
    ex.bind("r", "a.*")
    assert ex.unbind_queue("q") == 2
    assert ex.bindings()[0].queue == "r"
    ex.unbind("r", "a.*")
    assert ex._root.empty()  # the trie does not keep dead branches


def test_make_exchange() -> None:
    for t in ExchangeType:
        assert make_exchange(t.value).type is t
    with pytest.raises(ConfigError, match="unknown exchange type 'x-consistent-hash'"):
        make_exchange("x-consistent-hash")


# (binding arguments, message headers, matches?) -- RabbitMQ's headers_match,
# each row checked against RabbitMQ through pika in test_amqp_rabbitmq_parity.py.
HEADERS_TABLE = [
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0}, True),  # extra headers are fine
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 2, "b": "x"}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, None, False),
    ({"a": 1}, {"a": 1}, True),  # no x-match: all
    ({"x-match": "all"}, None, True),  # all of nothing: every message
    ({"x-match": "any"}, {"a": 1}, False),  # any of nothing: none
    ({"x-match": "any", "c": None}, {"c": 5}, True),  # void: presence only
    ({"x-match": "all", "c": None}, {"d": 5}, False),
    ({"x-match": "all", "a": 1}, {"a": "1"}, False),  # a string is not a number
    ({"x-match": "all", "a": 1}, {"a": True}, False),  # nor is a boolean
    ({"x-match": "all", "a": 1}, {"a": 1.0}, True),  # numbers compare by value (Erlang's ==)
    ({"x-match": "all", "b": "x"}, {"b": b"x"}, True),  # text and the same UTF-8 bytes are one longstr
    ({"x-match": "all", "x-k": 1}, {}, True),  # x- arguments are ignored...
    ({"x-match": "all-with-x", "x-k": 1}, {}, False),  # ...unless asked for
    ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
]


@pytest.mark.parametrize(("args", "headers", "expected"), HEADERS_TABLE)
def test_headers_table(args: dict[str, Any], headers: dict[str, Any] | None, expected: bool) -> None:
    assert headers_match(args, headers) is expected
    ex = make_exchange("headers")
    ex.bind("q", headers_binding_key("", args))
    ex.bind("other", headers_binding_key("", {"x-match": "any", "never": "sent"}))
    assert set(ex.route("ignored.key", headers)) == ({"q"} if expected else set())


def test_headers_bindings_differ_by_arguments_and_a_bad_x_match_is_refused() -> None:
    ex = make_exchange("headers")
    k1, k2 = headers_binding_key("", {"a": 1}), headers_binding_key("", {"a": 2})
    assert ex.bind("q", k1) and ex.bind("q", k2)
    assert not ex.bind("q", headers_binding_key("", {"a": 1}))  # the same arguments: the same binding
    assert set(ex.route("", {"a": 2})) == {"q"}
    assert ex.unbind("q", k2)
    assert set(ex.route("", {"a": 2})) == set()
    assert set(ex.route("", {"a": 1})) == {"q"}
    with pytest.raises(ConfigError, match="invalid x-match"):
        headers_binding_key("", {"x-match": "some"})
    assert set(ex.route("", ["not", "a", "map"])) == set()  # type: ignore[arg-type]  # from a hand-made client


# -- properties ----------------------------------------------------------------

# Small alphabets so that random patterns and keys actually meet.
words = st.sampled_from(["a", "b", "c", ""])
keys = st.lists(words, max_size=5).map(".".join)
pattern_words = st.sampled_from(["a", "b", "", "*", "#"])
patterns = st.lists(pattern_words, max_size=5).map(".".join)


@settings(max_examples=300, deadline=None)
@given(
    bindings=st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3"]), patterns), max_size=8),
    key=keys,
)
def test_topic_trie_equals_reference(bindings: list[tuple[str, str]], key: str) -> None:
    ex = TopicExchange()
    for queue, pattern in bindings:
        ex.bind(queue, pattern)
    expected = {q for q, p in bindings if topic_matches(p, key)}
    assert set(ex.route(key)) == expected


@settings(max_examples=200, deadline=None)
@given(
    bindings=st.lists(st.tuples(st.sampled_from(["q1", "q2"]), patterns), max_size=8),
    removed=st.lists(st.integers(min_value=0, max_value=7), max_size=8),
    key=keys,
)
def test_topic_unbind_equals_never_bound(
    bindings: list[tuple[str, str]], removed: list[int], key: str
) -> None:
    ex = TopicExchange()
    for queue, pattern in bindings:
        ex.bind(queue, pattern)
    gone = {bindings[i] for i in removed if i < len(bindings)}
    for queue, pattern in gone:
        ex.unbind(queue, pattern)
    fresh = TopicExchange()
    for b in bindings:
        if b not in gone:
            fresh.bind(*b)
    assert set(ex.route(key)) == set(fresh.route(key))


@given(key=keys)
def test_hash_alone_matches_everything(key: str) -> None:
    assert topic_matches("#", key)


@given(key=keys)
def test_star_matches_exactly_one_word(key: str) -> None:
    assert topic_matches("*", key) is (len(split_key(key)) == 1)


@given(key=keys)
def test_literal_pattern_is_direct(key: str) -> None:
    topic, direct = TopicExchange(), DirectExchange()
    for k in ("a", "a.b", "", ".", "a..b"):
        topic.bind(k, k)
        direct.bind(k, k)
    assert set(topic.route(key)) == set(direct.route(key))


class _CountingDict(dict[str, object]):
    lookups = 0

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        _CountingDict.lookups += 1
        return super().get(key, default)


def _count_lookups(ex: TopicExchange, key: str) -> int:
    """How many trie edges ``route(key)`` looks at."""
    todo = [ex._root]
    while todo:
        node = todo.pop()
        node.words = _CountingDict(node.words)  # type: ignore[assignment]
        todo += [*node.words.values(), *(n for n in (node.star, node.hash) if n is not None)]  # type: ignore[list-item]
    _CountingDict.lookups = 0
    ex.route(key)
    return _CountingDict.lookups


@pytest.mark.parametrize("key", ["stock.ibm.nyse", "bond.x.y.z", "s5", ""])
def test_topic_work_independent_of_non_matching_bindings(key: str) -> None:
    """The trie looks at the same edges whether 1 or 1024 bindings miss."""
    work = []
    for n in (1, 1024):
        ex = TopicExchange()
        ex.bind("hit", "stock.ibm.*")
        ex.bind("hit", "#.nyse")
        for i in range(n):
            ex.bind(f"miss{i}", f"stock.other{i}.nyse")
            ex.bind(f"miss{i}", f"*.s{i}.#")
            ex.bind(f"miss{i}", f"#.x{i}")
        work.append(_count_lookups(ex, key))
    assert work[0] == work[1] > 0 or key == ""


ops = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.sampled_from(["q1", "q2"]), patterns),
        st.tuples(st.just("unbind"), st.sampled_from(["q1", "q2"]), patterns),
        st.tuples(st.just("route"), st.just(""), keys),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, cap=st.sampled_from([2, 5, 65_536]))
def test_dfa_cache_stays_exact_across_binds_and_resets(
    ops: list[tuple[str, str, str]], cap: int
) -> None:
    """Routing many keys on one exchange (so the lazy DFA is reused, dropped on
    bind/unbind, and reset when full) always equals the reference."""
    import cmq.routing.exchanges as mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "MAX_DFA_TRANSITIONS", cap)
        _check_ops(ops)


def _check_ops(ops: list[tuple[str, str, str]]) -> None:
    ex = TopicExchange()
    bound: set[tuple[str, str]] = set()
    for op, queue, text in ops:
        if op == "bind":
            ex.bind(queue, text)
            bound.add((queue, text))
        elif op == "unbind":
            ex.unbind(queue, text)
            bound.discard((queue, text))
        else:
            for _ in range(2):  # the second time through the cached transitions
                assert set(ex.route(text)) == {q for q, p in bound if topic_matches(p, text)}
