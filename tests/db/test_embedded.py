"""The embedded PostgreSQL: started in a temporary directory, used, reused, stopped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.db.embedded import (
    DEFAULT_DATA_DIR,
    EmbeddedPostgres,
    EmbeddedUnavailable,
    data_dir_from_environment,
    pgserver_binaries,
    socket_dir_for,
    system_binaries,
)

BINARIES = {"system": system_binaries(), "pgserver": pgserver_binaries()}


@pytest.fixture(params=sorted(BINARIES))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    bin_dir = BINARIES[request.param]
    if bin_dir is None:
        if not any(BINARIES.values()):
            pytest.fail("no PostgreSQL binaries at all: install PostgreSQL or the pgserver package")
        pytest.skip(f"no {request.param} PostgreSQL binaries here")
    embedded = EmbeddedPostgres.at(tmp_path / "pgdata", bin_dir)
    try:
        yield embedded
    finally:
        embedded.stop()


def _query(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as connection:
            result = connection.execute(sa.text(sql))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def test_starts_serves_is_reused_and_stops(server: EmbeddedPostgres) -> None:
    assert not server.is_running()
    assert server.start() is True
    assert server.is_running()
    assert _query(server.url(), "SELECT current_database(), current_user") == [
        ("routemaster", "postgres")
    ]
    _query(server.url(), "CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)")

    assert server.start() is False  # already running: reused
    assert server.stop() is True
    assert not server.is_running()
    assert server.stop() is False

    assert server.start() is True
    assert _query(server.url(), "SELECT x FROM kept") == [(7,)]


def test_concurrent_starts_start_it_once(server: EmbeddedPostgres) -> None:
    results: list[bool] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            results.append(server.start())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(results) == [False, False, False, True]


def test_refuses_a_directory_that_is_not_a_cluster(tmp_path: Path) -> None:
    bin_dir = system_binaries() or pgserver_binaries()
    assert bin_dir is not None
    data_dir = tmp_path / "pgdata"
    data_dir.mkdir()
    (data_dir / "precious.txt").write_text("not a database")
    with pytest.raises(EmbeddedUnavailable, match="not empty"):
        EmbeddedPostgres.at(data_dir, bin_dir).start()
    assert (data_dir / "precious.txt").read_text() == "not a database"


def test_socket_goes_in_the_data_dir_unless_the_path_is_too_long() -> None:
    short = Path("/srv/routemaster/pgdata")
    assert socket_dir_for(short) == short
    long = Path("/srv/" + "x" * 120 + "/pgdata")
    assert socket_dir_for(long).name.startswith("routemaster-pg-")
    assert socket_dir_for(long) == socket_dir_for(long)
    assert socket_dir_for(Path("/srv/with space/pgdata")) != Path("/srv/with space/pgdata")


def test_data_dir_comes_from_the_environment() -> None:
    assert data_dir_from_environment({}) == DEFAULT_DATA_DIR
    assert data_dir_from_environment({"ROUTEMASTER_DATA_DIR": "/var/pg"}) == Path("/var/pg")


def test_listens_on_a_free_loopback_port_and_a_socket(server: EmbeddedPostgres) -> None:
    server.start()
    url = sa.engine.make_url(server.url())
    assert (url.host, url.port, url.database, url.username) == (
        "127.0.0.1",
        server.port(),
        "routemaster",
        "postgres",
    )
    assert url.port != 5432
    assert (server.socket_dir / f".s.PGSQL.{url.port}").is_socket()


def test_made_state_folder_is_ignored_by_git(tmp_path: Path) -> None:
    bin_dir = system_binaries() or pgserver_binaries()
    assert bin_dir is not None
    embedded = EmbeddedPostgres.at(tmp_path / "state" / "pgdata", bin_dir)
    assert not embedded.is_running()
    embedded.stop()
    assert (tmp_path / "state" / ".gitignore").read_text() == "*\n"
