"""Prepared statements behind PgBouncer in transaction mode, where each transaction
may run on another server connection: every create and read still answers right.

Runs a real PgBouncer (Debian's ``pgbouncer``, which scripts/test installs);
skipped where it is not installed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.app import utc_now
from routemaster.db import labels as store
from routemaster.db.database import create_engine
from routemaster.db.statements import single_statement
from tests.serving import free_port
from tests.waiting import wait_until

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.fixture
def pooled_url(database_url: str) -> Iterator[str]:
    """The test database through PgBouncer: transaction mode, two server connections."""
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    target = sa.engine.make_url(database_url)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="routemaster-pgbouncer-"))
    folder.chmod(0o755)  # PgBouncer may run as another user (it refuses to run as root)
    (folder / "users.txt").write_text(f'"{target.username}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
pooled = host={target.host or "127.0.0.1"} port={target.port or 5432} dbname={target.database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
logfile = {folder / "pgbouncer.log"}
"""
    )
    command = [PGBOUNCER, "-q", str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("PgBouncer will not run as root, and there is no postgres user to run it")
        command[1:1] = ["-u", "postgres"]
        shutil.chown(folder, "postgres")  # its log file
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        def why() -> str:
            process.kill()
            errors = process.communicate()[1].decode(errors="replace")
            log = folder / "pgbouncer.log"
            return f"pgbouncer started: {errors} {log.read_text() if log.exists() else ''}"

        wait_until(lambda: listening() or process.poll() is not None, why, timeout=10, every=0.05)
        assert process.poll() is None, why()
        yield target.set(host="127.0.0.1", port=port, database="pooled").render_as_string(
            hide_password=False
        )
    finally:
        process.terminate()
        process.communicate(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def test_creates_and_reads_answer_right_behind_a_transaction_pooler(
    db_engine: sa.Engine, pooled_url: str
) -> None:
    # Four client connections share two server connections: a statement prepared on one
    # is executed where it does not exist, or prepared where another client's already is.
    engine = create_engine(pooled_url, pool_size=4, max_overflow=0)

    def work(client: int) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        for i in range(40):
            name = f"c{client}-{i}"
            with single_statement(engine) as conn:
                created = store.insert(
                    conn, "flow", name, {"i": i}, state="start", now=utc_now(), due=False
                )
            assert created is not None and created.name == name
            with single_statement(engine) as conn:
                read = store.get(conn, "flow", name)
            assert read is not None
            seen.append((read.name, read.metadata["i"]))
            with engine.begin() as conn:  # a transaction's statements, behind the same pooler
                merged = store.merge_metadata(conn, "flow", name, {"seen": True})
            assert merged is not None and merged.metadata == {"i": i, "seen": True}
        return seen

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    engine.dispose()
    assert results == [[(f"c{c}-{i}", i) for i in range(40)] for c in range(4)]
    with db_engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT count(*) FROM labels WHERE state = 'start'"))
        assert stored.scalar() == 160
