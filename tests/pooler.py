"""A real PgBouncer in transaction mode in front of the test database.

Debian's ``pgbouncer`` (scripts/test installs it), with its default settings
(it refuses the startup parameter ``options``). ``ROUTEMASTER_TEST_POOLER=1``
makes the whole test session reach its database through one
(tests/conftest.py): ``scripts/test`` runs the API and worker end-to-end
tests a second time that way.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.serving import free_port
from tests.waiting import wait_until

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
POOLED_RUN = "ROUTEMASTER_TEST_POOLER"
"""Set (to anything but empty or 0): the session's database is reached through PgBouncer."""


def pooled_run() -> bool:
    """Whether this test session reaches its database through PgBouncer."""
    return os.environ.get(POOLED_RUN, "") not in ("", "0")


@contextmanager
def running_pgbouncer(database_url: str, *, pool_size: int) -> Iterator[str]:
    """PgBouncer in transaction mode with ``pool_size`` server connections; yields its URL.

    Skips the test where PgBouncer is not installed, or cannot run (as root
    with no ``postgres`` user to run it as).
    """
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
default_pool_size = {pool_size}
max_client_conn = 1000
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
