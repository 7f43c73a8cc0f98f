"""Label keys (migration 0006): names of any length in the indexes, found, unique and ordered."""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.keys import (
    SHARD_KEYS,
    WHOLE,
    label_key,
    label_key_arrays,
    prefix_bounds,
    shard_key,
)
from routemaster.db.listings import label_page
from routemaster.db.statements import fetch_all
from tests.db.test_statement_text import STATEMENTS

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
RANDOM = random.Random(2017)


def varied(size: int, low: int, high: int) -> str:
    """``size`` random characters from ``low``..``high``: UTF-8 that does not compress."""
    return "".join(chr(RANDOM.randint(low, high)) for _ in range(size))


FOUR_BYTES = varied(1024, 0x10000, 0x10FFFF)
THREE_BYTES = varied(1024, 0x4E00, 0x9FFF)

names = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    min_size=1,
    max_size=1024,
)


def sql_key(conn: sa.Connection, name: str) -> bytes:
    key = conn.execute(sa.text("SELECT routemaster_label_key(:n)"), {"n": name}).scalar_one()
    return bytes(key)


def create(conn: sa.Connection, name: str, machine: str = "m") -> None:
    label = transitions.insert(conn, machine, name, {"name": name}, state="a", now=NOW, due=False)
    assert label is not None, f"{name[:20]!r} was taken"


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "a\\b",
        "\\x41",
        "é" * 512,  # exactly 1,024 bytes
        "é" * 512 + "x",  # 1,025 bytes
        "x" + "😀" * 256,  # 1,025 bytes: the cut falls inside a character
        "x" * 1024,
        "x" * 1025,
        FOUR_BYTES,
        THREE_BYTES,
    ],
    ids=lambda name: f"{len(name)}-chars-{len(name.encode())}-bytes",
)
def test_the_database_and_the_code_compute_the_same_key(db_engine: sa.Engine, name: str) -> None:
    with db_engine.connect() as conn:
        assert sql_key(conn, name) == label_key(name)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=names)
def test_any_name_has_the_same_key_in_the_database_and_the_code(
    db_engine: sa.Engine, name: str
) -> None:
    with db_engine.connect() as conn:
        assert sql_key(conn, name) == label_key(name)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=names)
def test_any_name_has_the_same_shard_key_in_the_database_and_the_code(
    db_engine: sa.Engine, name: str
) -> None:
    """Migration 0017 backfilled with the SQL function; the statements pass the Python one."""
    with db_engine.connect() as conn:
        found = conn.execute(sa.text("SELECT routemaster_shard_key(:n)"), {"n": name})
        assert found.scalar_one() == shard_key(name)
    assert 0 <= shard_key(name) < SHARD_KEYS


def test_the_shard_key_is_the_first_two_bytes_of_the_sha256_modulo_4096() -> None:
    # sha256("a") begins ca 97: 0xca97 = 51863, and 51863 % 4096 = 2711
    assert shard_key("a") == 2711
    assert SHARD_KEYS == 4096


def test_short_names_are_their_own_keys_and_long_ones_are_marked_and_hashed() -> None:
    assert label_key("é" * 512) == ("é" * 512).encode()
    for name in (FOUR_BYTES, THREE_BYTES, "x" * 1025):
        key = label_key(name)
        assert len(key) == WHOLE + 1 + 32 and key[WHOLE] == 0xFF
        assert key[:WHOLE] == name.encode()[:WHOLE]


def test_a_short_name_equal_to_any_prefix_of_a_long_key_is_another_label(
    db_engine: sa.Engine,
) -> None:
    """Keys of short names are at most 1,024 bytes with no 0xFF: never a long name's key."""
    with db_engine.begin() as conn:
        for long in (FOUR_BYTES, THREE_BYTES, "x" * 1030):
            key = label_key(long)
            shorts = set()
            for size in range(1, len(key) + 1):
                try:
                    short = key[:size].decode()
                except UnicodeDecodeError:
                    continue  # not a name: cut inside a character, or past the 0xFF
                assert label_key(short) != key
                shorts.add(short)
            assert WHOLE - 3 <= max(len(short.encode()) for short in shorts) <= WHOLE
            create(conn, long)
            picked = sorted(shorts, key=len)
            for short in [*picked[:3], *picked[-3:]]:
                create(conn, short)
            for name in (long, *picked[:3], *picked[-3:]):
                found = store.get(conn, "m", name)
                assert found is not None and found.metadata == {"name": name}
            conn.execute(sa.text("TRUNCATE labels, history"))


@pytest.mark.parametrize("long", [FOUR_BYTES, THREE_BYTES], ids=["4-byte", "3-byte"])
def test_long_names_sharing_their_first_900_characters_are_distinct_labels(
    db_engine: sa.Engine, long: str
) -> None:
    others = [long[:900] + tail for tail in (long[900:][::-1], "x" * 124, long[900:] + "y")]
    with db_engine.begin() as conn:
        for name in (long, *others[:2]):
            create(conn, name)
        assert transitions.insert(conn, "m", long, {}, state="a", now=NOW, due=False) is None
        create(conn, long, machine="other")  # the same name in another machine
        for name in (long, *others[:2]):
            found = store.get(conn, "m", name)
            assert found is not None and found.name == name and found.metadata == {"name": name}
            assert len(store.history(conn, "m", name)) == 1
        assert store.get(conn, "m", others[2]) is None  # one character more: no such label
        assert store.is_deleted(conn, "m", others[2]) is None


def test_names_sharing_their_first_1024_bytes_differ_by_hash_and_page_exactly(
    db_engine: sa.Engine,
) -> None:
    """Same key prefix, different hashes: every label once, in one total order."""
    base = "x" * WHOLE
    names = [base + tail for tail in ("", "a", "b", "c", "ab", "😀", "\\")] + [base[:-1]]
    with db_engine.begin() as conn:
        for name in names:
            create(conn, name)
    seen: list[str] = []
    after = ""
    while page := label_page(db_engine, "m", after=after, limit=2):
        seen += [name for name, _ in page]
        after = page[-1][0]
    assert sorted(seen) == sorted(names) and len(seen) == len(names)
    assert seen == sorted(names, key=label_key)
    assert seen[:2] == [base[:-1], base]  # whole names first, then the hashed ones


def test_listing_is_in_code_point_order_whatever_the_collation(db_engine: sa.Engine) -> None:
    names = ["b", "B", "a", "ä", "Z", "é", "e", "😀", "文", "a b", "a-b", "ab", "\x7f", "~"]
    with db_engine.begin() as conn:
        for name in names:
            create(conn, name)
    listed = [name for name, _ in label_page(db_engine, "m", after="", limit=100)]
    assert listed == sorted(names)  # Python sorts str by code point
    after_e = [name for name, _ in label_page(db_engine, "m", after="e", limit=100)]
    assert after_e == [name for name in sorted(names) if name > "e"]


@pytest.mark.parametrize("long", [FOUR_BYTES, THREE_BYTES, "x" * 1100], ids=str.__len__)
def test_prefix_listing_finds_exactly_the_names_with_the_prefix(
    db_engine: sa.Engine, long: str
) -> None:
    names = [long, long[:-1], long[:10], long[:10] + "!", long[:9], long[:300] + "other" * 200]
    with db_engine.begin() as conn:
        for name in names:
            create(conn, name)
    for prefix in (long[:1], long[:9], long[:10], long[:300], long[:-1], long, long + "z"):
        lowest, highest = prefix_bounds(prefix)
        assert all(
            lowest <= label_key(name) <= highest for name in names if name.startswith(prefix)
        )
        listed = [
            name for name, _ in label_page(db_engine, "m", after="", limit=100, prefix=prefix)
        ]
        assert listed == sorted((n for n in names if n.startswith(prefix)), key=label_key)


# Index use: each statement that finds labels by name is planned on an index.


@pytest.fixture
def many_labels(db_engine: sa.Engine) -> Iterator[sa.Engine]:
    with db_engine.begin() as conn:
        conn.execute(
            sa.text(
                # a tenth leased to other workers, as work in flight is
                "INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id, "
                "                    lease_owner, due_at, name_key, shard_key) "
                "SELECT 'm', 'n' || g, 'a', now(), g, "
                "       CASE WHEN g % 10 = 0 THEN 'another' END, "
                "       CASE WHEN g % 10 = 0 THEN now() + interval '1 minute' END, "
                "       routemaster_label_key('n' || g), routemaster_shard_key('n' || g) "
                "FROM generate_series(1, 5000) g"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO history (state_machine, label, new_state, shard_key) "
                "SELECT 'm', 'n' || (g % 5000), 'a', routemaster_shard_key('n' || (g % 5000)) "
                "FROM generate_series(1, 20000) g"
            )
        )
        create(conn, FOUR_BYTES)
    with db_engine.connect() as conn:
        conn.execute(sa.text("ANALYZE labels, history"))
        conn.commit()
    yield db_engine


SQL = dict(STATEMENTS)


def plan(conn: sa.Connection, sql: str, params: dict[str, Any]) -> str:
    return "\n".join(row[0] for row in fetch_all(conn, "EXPLAIN " + sql, params))


@pytest.mark.parametrize(
    "statement",
    [
        "labels._SELECT",
        "labels._SELECT_FOR_UPDATE",
        "labels._IS_DELETED",
        "transitions._MERGE_METADATA",
        "transitions._DELETE",
        "transitions._SET_PAUSED",
        "transitions._SET_PAUSE_END",
        "transitions._SET_VERSION",
    ],
)
def test_lookups_by_name_use_the_primary_key(many_labels: sa.Engine, statement: str) -> None:
    params: dict[str, Any] = {
        "sm": "m",
        "name": FOUR_BYTES,
        "key": label_key(FOUR_BYTES),
        "shard_key": shard_key(FOUR_BYTES),
    }
    params.update(patch="{}", now=NOW, paused=False, scheduled_states=["a"], until=None, v=1)
    params.update(running=None, continuing=False)
    with many_labels.connect() as conn:
        explained = plan(conn, SQL[statement], params)
    assert "labels_pkey" in explained and "Seq Scan" not in explained, explained


def test_history_and_batches_use_indexes(many_labels: sa.Engine) -> None:
    from routemaster.db import schedules

    one = {
        "sm": "m",
        "name": FOUR_BYTES,
        "key": label_key(FOUR_BYTES),
        "shard_key": shard_key(FOUR_BYTES),
    }
    arrays = {**label_key_arrays([("m", FOUR_BYTES), ("m", "n7")]), "entries": [1, 7]}
    move = {
        "old": "a",
        "new": "b",
        "forced": False,
        "reason": None,
        "due_at": None,
        "next_check_at": None,
        "now": NOW,
        "version": None,
    }
    batch = {
        "now": NOW,
        **{f"m_{k}": [v, v] for k, v in (("old", "a"), ("new", "b"), ("forced", False))},
        "m_sm": ["m", "m"],
        "m_name": [FOUR_BYTES, "n7"],
        "m_reason": [None, None],
        "m_shard_key": [shard_key(FOUR_BYTES), shard_key("n7")],
        "m_version": [None, None],
        "f_shard_key": [shard_key(FOUR_BYTES), shard_key("n7")],
        "f_sm": ["m", "m"],
        "f_name": [FOUR_BYTES, "n7"],
        "f_key": [label_key(FOUR_BYTES), label_key("n7")],
        "f_due_at": [None, None],
        "f_next_check_at": [None, None],
    }
    computed = {"next_checks": [NOW, None], "dues": [NOW, None]}
    worker = {"lease_until": NOW, "me": "w", "entry_id": 1, "due_at": NOW, "error": "e"}
    with many_labels.connect() as conn:
        history = plan(conn, store._HISTORY, one)
        assert "history_by_label" in history and "Seq Scan" not in history, history
        for explained in (
            plan(conn, SQL["label_claims._LOCK_ENTRIES"], arrays),
            plan(conn, schedules._CLEAR_DUE, arrays),
            plan(conn, SQL["transitions._MOVE_ONE"], {**one, **move}),
            plan(conn, SQL["transitions._MOVE_MANY"], batch),
            plan(conn, schedules._SETTLE_UNMOVED, {**arrays, **computed}),
            plan(conn, schedules._SCHEDULE, {**arrays, **computed}),
            *(
                plan(conn, query, {**one, **arrays, **worker})
                for query in (
                    SQL["label_claims._LEASE"],
                    SQL["label_claims._EXTEND_LEASES"],
                    SQL["label_claims._RECORD_RETRY"],
                )
            ),
        ):
            assert "labels_pkey" in explained, explained
            assert "Seq Scan on labels" not in explained, explained
        # A retry names its labels by primary key; with few errored labels PostgreSQL may
        # walk the errored ones (the partial index labels_errored) instead: an index either way.
        retry = plan(conn, SQL["transitions._RETRY"], {**arrays, "now": NOW})
        assert "labels_pkey" in retry or "labels_errored" in retry, retry
        assert "Seq Scan on labels" not in retry, retry
        unscheduled = plan(
            conn,
            SQL["label_claims._LOCK_UNSCHEDULED"],
            {"machines": ["m"], "states": ["a"], "limit": 500, "shard_keys": None},
        )
        assert "labels_unscheduled" in unscheduled, unscheduled
        assert "Seq Scan on labels" not in unscheduled, unscheduled


def test_pages_are_index_range_scans(many_labels: sa.Engine) -> None:
    """Pages walk an index in key order; a prefix is a range of the primary key."""
    from routemaster.db import listings

    lowest, highest = prefix_bounds("n12")
    common = {"sm": "m", "after": label_key("n1"), "limit": 50}
    with many_labels.connect() as conn:

        def explain(query: str, **params: Any) -> str:
            return plan(conn, query, {**common, **params})

        for explained in (
            explain(listings._PAGE),
            explain(listings._PAGE_IN_STATE, state="a"),
        ):
            assert "Index Cond" in explained and "Sort" not in explained, explained
        by_prefix = explain(
            listings._PAGE_PREFIX, state=None, prefix="n12", lowest=lowest, highest=highest
        )
    assert "Seq Scan" not in by_prefix, by_prefix
    assert "Index Cond: ((state_machine = 'm'::text) AND (name_key > " in by_prefix, by_prefix
    assert "(name_key <= '\\x6e3132ffff" in by_prefix, by_prefix
