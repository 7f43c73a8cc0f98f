"""Database failures other than an outage: their own JSON answer, no SQL, one log line."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App, Settings
from routemaster.config.model import Config
from routemaster.db.errors import Kind, describe_failure
from routemaster.db.plumbing.database import create_engine
from routemaster.db.statements import fetch_value, run, single_statement
from routemaster.web import create_app
from tests.api.helpers import body

LABEL = "/state-machines/user/labels/ann"


@pytest.fixture
def impatient(database_url: str, config: Config, db_engine: sa.Engine) -> Iterator[FlaskClient]:
    """A client whose engine cuts every statement off after 0.3 s."""
    engine = create_engine(database_url, statement_timeout=0.3)
    settings = Settings(statement_timeout=0.3)
    yield create_app(App(config=config, db=engine, settings=settings)).test_client()
    engine.dispose()


def test_statement_timeout_is_set_in_every_transaction_and_never_on_the_connection(
    database_url: str,
) -> None:
    # Per transaction, so that it holds behind a transaction-mode pooler and never
    # leaks onto a server connection another client uses next.
    engine = create_engine(database_url, statement_timeout=1.5)
    try:
        for _ in range(2):
            with engine.begin() as conn:
                assert fetch_value(conn, "SHOW statement_timeout") == "1500ms"
                assert fetch_value(conn, "SHOW statement_timeout") == "1500ms"
            with single_statement(engine) as conn:
                assert fetch_value(conn, "SHOW statement_timeout") == "1500ms"
        with engine.connect() as conn:
            session = conn.connection.driver_connection
            assert session is not None
            with session.cursor() as cursor:  # outside any transaction of ours: the default
                cursor.execute("SHOW statement_timeout")
                assert cursor.fetchone() == ("0",)
    finally:
        engine.dispose()


def test_a_statement_that_runs_too_long_is_504_json_not_an_outage(
    impatient: FlaskClient, db_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-metadata-value"
    assert impatient.post(LABEL, json={"metadata": {"a": 1}}).status_code == 201
    # Another transaction holds the label's row lock: the PATCH waits on it
    # until the statement timeout cuts it off.
    with db_engine.begin() as holder:
        holder.execute(sa.text("SELECT 1 FROM labels WHERE name = 'ann' FOR UPDATE"))
        with caplog.at_level(logging.INFO):
            response = impatient.patch(LABEL, json={"metadata": {"b": secret}})
    assert response.status_code == 504
    message = body(response)["message"]
    assert "statement timeout (0.3 s)" in message
    assert "Cannot connect" not in message
    assert "UPDATE" not in message and secret not in message
    records = [r for r in caplog.records if r.name == "routemaster.webcore.error_responses"]
    assert len(records) == 1
    logged = records[0].getMessage()
    assert "57014" in logged
    assert "UPDATE" not in logged and secret not in logged
    assert body(impatient.get(LABEL))["metadata"] == {"a": 1}


def test_an_unreachable_server_is_the_only_cannot_connect(config: Config) -> None:
    engine = create_engine("postgresql://nobody:pw@127.0.0.1:9/none")
    try:
        response = create_app(App(config=config, db=engine)).test_client().get(LABEL)
    finally:
        engine.dispose()
    assert response.status_code == 503
    assert body(response) == {"message": "Cannot connect to database"}


def _error_from(engine: sa.Engine, statement: str) -> sa.exc.SQLAlchemyError:
    with engine.connect() as connection:
        try:
            run(connection, statement)  # as the service runs statements (its timeout is set so)
        except sa.exc.SQLAlchemyError as error:
            return error
    raise AssertionError("the statement did not fail")


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("SELECT CAST('{' AS jsonb)", Kind.REFUSED),
        ("SELECT pg_sleep(5)", Kind.TIMEOUT),
        ("SELECT * FROM no_such_table", Kind.OTHER),
        # Citus's code when a shard move cut a statement run in steps short
        ("DO $$ BEGIN RAISE EXCEPTION 'moved' USING ERRCODE = 'CIINF'; END $$", Kind.MOVED),
    ],
)
def test_failures_are_classified_by_what_the_server_said(
    database_url: str, statement: str, kind: Kind
) -> None:
    engine = create_engine(database_url, statement_timeout=0.2)
    try:
        failure = describe_failure(_error_from(engine, statement))
    finally:
        engine.dispose()
    assert failure.kind is kind
    assert "SELECT" not in failure.log_line()


# What Citus raises when a shard move cuts a statement short, raised here by a trigger.
_MOVED_UNDER_IT = (
    "CREATE FUNCTION moved_under_it() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN RAISE EXCEPTION 'Query could not find the intermediate result file'"
    " USING ERRCODE = 'CIINF'; END $$",
    "CREATE TRIGGER moved_under_it BEFORE INSERT ON labels"
    " FOR EACH ROW EXECUTE FUNCTION moved_under_it()",
)
_NOT_MOVED = ("DROP TRIGGER moved_under_it ON labels", "DROP FUNCTION moved_under_it()")


def test_a_shard_moved_under_a_request_is_503_with_retry_after(
    client: FlaskClient, db_engine: sa.Engine
) -> None:
    """On Citus a shard move can cut a statement short (routemaster/db/errors.py): nothing
    was done, and the client is told to ask again, never given a 500."""
    with db_engine.begin() as conn:
        for statement in _MOVED_UNDER_IT:
            conn.execute(sa.text(statement))
    try:
        response = client.post(LABEL, json={"metadata": {}})
    finally:
        with db_engine.begin() as conn:
            for statement in _NOT_MOVED:
                conn.execute(sa.text(statement))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert "moved to another node" in body(response)["message"]
    assert client.get(LABEL).status_code == 404


def test_index_row_too_large_is_a_server_limit(db_engine: sa.Engine) -> None:
    """A value too large for a btree entry, on a table of its own (labels index by key)."""
    value = "".join(chr(random.randint(0x4E00, 0x9FFF)) for _ in range(1024))
    with db_engine.connect() as connection:
        connection.execute(sa.text("CREATE TEMPORARY TABLE wide (value text PRIMARY KEY)"))
        try:
            connection.execute(sa.text("INSERT INTO wide VALUES (:value)"), {"value": value})
        except sa.exc.SQLAlchemyError as error:
            failure = describe_failure(error)
        else:
            pytest.skip("this server compressed the index row")
    assert failure.kind is Kind.TOO_LARGE
    assert "index row" in failure.detail
    assert value not in failure.log_line()
