"""The SQLite store's FIFO receive walks groups through an index: it picks what
the reference rule (:func:`cmq.service.ordering.fifo_picks`) picks, and never
scans the messages a blocked group holds."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from cmq.service.ordering import fifo_picks
from cmq.service.store.sqlite import _SCHEMA, _fifo_picks

NOW = 1000


def _conn() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.executescript(_SCHEMA)
    return conn


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([0, NOW, NOW + 1])),
        max_size=40,
    ),
    n=st.integers(1, 10),
)
def test_index_walk_picks_what_the_reference_picks(rows: list[tuple[str, int]], n: int) -> None:
    conn = _conn()
    conn.executemany(
        "INSERT INTO messages (queue, seq, payload, group_id, visible_at) VALUES (?, ?, ?, ?, ?)",
        [("f", seq, "x", group, at) for seq, (group, at) in enumerate(rows, 1)],
    )
    # Another queue's messages change nothing.
    conn.execute("INSERT INTO messages VALUES ('g', 1, 'x', 'a', 0, 0, 0, '')")
    expected = fifo_picks(((seq, group, at <= NOW) for seq, (group, at) in enumerate(rows, 1)), n)
    assert _fifo_picks(conn, "f", NOW, n) == expected


def test_no_query_of_the_walk_scans_the_queue() -> None:
    conn = _conn()
    conn.executemany(
        "INSERT INTO messages (queue, seq, payload, group_id, visible_at) VALUES (?, ?, ?, ?, ?)",
        [("f", seq, "x", "blocked", NOW + 1 if seq == 1 else 0) for seq in range(1, 2001)]
        + [("f", 5000, "x", "open", 0)],
    )
    plans: list[str] = []
    original = conn.execute

    def explain(sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        plans.extend(str(r[3]) for r in original("EXPLAIN QUERY PLAN " + sql, args))
        return original(sql, args)

    class Spy:
        execute = staticmethod(explain)

    assert _fifo_picks(Spy(), "f", NOW, 10) == [5000]  # type: ignore[arg-type]
    assert plans and all("messages_group" in p for p in plans), plans
