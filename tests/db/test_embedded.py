"""The embedded PostgreSQL: started in a temporary directory, used, reused, stopped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.db.plumbing.database import create_engine
from routemaster.db.plumbing.embedded import (
    EmbeddedPostgres,
    EmbeddedUnavailable,
    data_dir_from_environment,
    find_binaries,
    major_version,
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


def test_data_dir_is_one_place_per_user_wherever_the_command_runs() -> None:
    assert data_dir_from_environment({"HOME": "/home/ann"}) == Path(
        "/home/ann/.local/share/routemaster/pgdata"
    )
    assert data_dir_from_environment({"HOME": "/home/ann", "XDG_DATA_HOME": "/data"}) == Path(
        "/data/routemaster/pgdata"
    )
    assert data_dir_from_environment({"ROUTEMASTER_DATA_DIR": "/var/pg"}) == Path("/var/pg")


def test_keeps_its_port_across_restarts_with_clients_connected(
    server: EmbeddedPostgres,
) -> None:
    server.start()
    url = server.url()
    engine = create_engine(url, idle_ping_after=0)  # a pool, as a running API holds one
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        server.stop()
        server.start()
        assert server.url() == url
        with engine.connect() as connection:  # its pool reconnects to the same address
            assert connection.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def _two_versions() -> tuple[Path, Path]:
    found = {major_version(d): d for d in BINARIES.values() if d is not None}
    if len(found) < 2:
        pytest.skip("needs PostgreSQL programs of two major versions (system and pgserver)")
    first, second = sorted(found)[:2]
    return found[first], found[second]


def test_a_data_dir_of_another_major_version_is_one_line_with_the_fix(tmp_path: Path) -> None:
    old, new = _two_versions()
    made = EmbeddedPostgres.at(tmp_path / "pgdata", old)
    made.start()
    made.stop()
    with pytest.raises(EmbeddedUnavailable) as raised:
        EmbeddedPostgres.at(tmp_path / "pgdata", new).start()
    message = str(raised.value)
    assert "\n" not in message
    assert f"made by PostgreSQL {major_version(old)}" in message
    assert f"remove {tmp_path / 'pgdata'}" in message and "ROUTEMASTER_DATA_DIR" in message


def test_the_programs_of_the_data_dirs_version_are_chosen_when_installed(tmp_path: Path) -> None:
    old, new = _two_versions()
    for programs in (old, new):
        data_dir = tmp_path / programs.parent.name / "pgdata"
        made = EmbeddedPostgres.at(data_dir, programs)
        made.start()
        made.stop()
        assert find_binaries(data_dir) == programs


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
