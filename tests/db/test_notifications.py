"""The listener checks that ``LISTEN`` works before relying on it, and keeps checking (SPEC F3).

On PostgreSQL itself the probe comes back and a ``NOTIFY routemaster_due``
wakes a waiting listener at once; through PgBouncer in transaction mode the
probe never comes back, so the listener says it polls and never listens on
the busy channel there; a listening connection that is cut is noticed and
listened on again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from routemaster.db.notifications import due_listener, notify_due
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_all, single_statement
from tests.pooler import running_pgbouncer
from tests.waiting import wait_until

# The backends listening on the due channel (the test's own check of where LISTEN went).
_DUE_LISTENERS = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND query = 'LISTEN routemaster_due'
    """

_CUT = "SELECT pg_terminate_backend(%(pid)s)"


@pytest.fixture
def direct(direct_database_url: str, db_engine: sa.Engine) -> Iterator[sa.Engine]:
    """PostgreSQL itself, whatever this session's DATABASE_URL is."""
    engine = create_engine(direct_database_url)
    yield engine
    engine.dispose()


def _notify(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        notify_due(conn)


def _listened_on(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return [pid for (pid,) in fetch_all(conn, _DUE_LISTENERS)]


def test_on_postgresql_the_probe_comes_back_and_a_notify_wakes_the_listener_at_once(
    direct: sa.Engine,
) -> None:
    told: list[bool] = []
    listener = due_listener(direct, direct, on_change=told.append)
    try:
        assert told == [False]  # polled until checked
        deadline = time.monotonic() + 10
        while not listener.listening and time.monotonic() < deadline:
            listener.wait(0.05)
        assert listener.listening and told == [False, True]
        _notify(direct)
        started = time.monotonic()
        heard = listener.wait(10.0)
        assert heard.payloads == [""]  # NOTIFY routemaster_due carries no payload
        assert time.monotonic() - started < 1.0
    finally:
        listener.close()


def test_through_pgbouncer_in_transaction_mode_the_check_fails_and_wake_ups_are_polled(
    direct_database_url: str, direct: sa.Engine
) -> None:
    with running_pgbouncer(direct_database_url, pool_size=2) as url:
        pooled = create_engine(url)
        told: list[bool] = []
        listener = due_listener(pooled, pooled, on_change=told.append)
        listener.check_within = 1.0
        try:
            started = time.monotonic()
            assert listener.wait(3.0).payloads == []  # the probe never came back
            assert time.monotonic() - started >= 3.0  # slept its whole timeout: polling
            assert not listener.listening and told == [False]
            _notify(pooled)
            assert listener.wait(0.5).payloads == []
            # Only the probe channel was listened to through the pooler, never the busy one.
            assert _listened_on(direct) == []
        finally:
            listener.close()
            pooled.dispose()


def test_a_listening_connection_that_is_cut_is_noticed_and_listened_on_again(
    direct: sa.Engine,
) -> None:
    told: list[bool] = []
    listener = due_listener(direct, direct, on_change=told.append)
    try:
        wait_until(lambda: listener.wait(0.05) is not None and listener.listening, "listening")
        [pid] = _listened_on(direct)
        with single_statement(direct) as conn:
            fetch_all(conn, _CUT, {"pid": pid})
        wait_until(lambda: listener.wait(0.05) is not None and not listener.listening, "polled")
        wait_until(
            lambda: listener.wait(0.05) is not None and listener.listening,
            "listening again",
            timeout=15,
        )
        assert told == [False, True, False, True]
        [again] = _listened_on(direct)
        assert again != pid
        _notify(direct)
        assert listener.wait(10.0).payloads == [""]
    finally:
        listener.close()
