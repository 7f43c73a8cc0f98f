"""Migration 0006 on a database that already has labels: they survive and are found; and back."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from routemaster.db import labels as store
from routemaster.db import transitions
from routemaster.db.listings import label_page
from routemaster.db.plumbing.database import create_engine
from routemaster.db.plumbing.migrate import alembic_config
from routemaster.db.upgrade import upgrade

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
NAMES = ["alice", "a/b", "café %", "é" * 1024, "文" * 900, "x" * 1024]


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """A database of its own at revision 0005, with labels and history written as 0005 had them."""
    server = sa.engine.make_url(database_url)
    name = f"routemaster_mig_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(server.set(database=name).render_as_string(hide_password=False))
    try:
        upgrade(engine, "0005")
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def downgrade(engine: sa.Engine, revision: str) -> None:
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def test_labels_written_before_the_upgrade_are_found_after_it(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for number, name in enumerate(NAMES, 1):
            conn.execute(
                sa.text(
                    "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at,"
                    " entry_id, errored) VALUES ('m', :name, CAST(:meta AS jsonb), 's', now(),"
                    " :id, :errored);"
                    "INSERT INTO history (id, state_machine, label, new_state)"
                    " VALUES (:id, 'm', :name, 's')"
                ),
                {"name": name, "meta": f'{{"n": {number}}}', "id": number, "errored": number > 3},
            )
    upgrade(engine)
    with engine.begin() as conn:
        for number, name in enumerate(NAMES, 1):
            found = store.get(conn, "m", name)
            assert found is not None and found.metadata == {"n": number}
            assert [entry.id for entry in store.history(conn, "m", name)] == [number]
        assert transitions.insert(conn, "m", "alice", {}, state="s", now=NOW, due=False) is None
    listed = [name for name, _ in label_page(engine, "m", after="", limit=100)]
    assert listed == sorted(NAMES)
    errored = label_page(engine, "m", after="", limit=100, errored=True, state="s")
    assert [name for name, _ in errored] == sorted(NAMES[3:])

    downgrade(engine, "0005")
    with engine.connect() as conn:
        primary_key = sa.inspect(conn).get_pk_constraint("labels")["constrained_columns"]
        rows = conn.execute(sa.text("SELECT name FROM labels ORDER BY name")).scalars().all()
    assert primary_key == ["state_machine", "name"]
    assert rows == sorted(NAMES)
    upgrade(engine)  # and up again
    with engine.connect() as conn:
        assert store.get(conn, "m", "é" * 1024) is not None


def test_a_downgrade_refuses_names_the_old_indexes_cannot_hold(engine: sa.Engine) -> None:
    upgrade(engine)
    varied = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1024))  # does not compress
    with engine.begin() as conn:
        transitions.insert(conn, "m", varied, {}, state="s", now=NOW, due=False)
    with pytest.raises(sa.exc.OperationalError, match="index row"):
        downgrade(engine, "0005")
    with engine.connect() as conn:
        assert store.get(conn, "m", varied) is not None  # nothing was undone
