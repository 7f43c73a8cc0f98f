"""A private PostgreSQL under a local data directory, for when no server was named.

``routemaster serve``, ``cron`` and ``migrate`` use it when asked to
(``ROUTEMASTER_DATABASE=embedded``, as ``scripts/run`` does; the test suite
uses it when no server answers), so a fresh clone runs without anyone
installing or configuring a database server. Its data lives in one place per
user (:func:`data_dir_from_environment`).

It listens on 127.0.0.1 on a port of its own (not 5432, which a system server
may hold; the same port at every start unless another program took it), and
on a unix socket in the data directory (or, for a long path, in a folder
under the temporary directory). Connections from this host are trusted. It is
started on demand, shared by every process asking for the same data
directory, and runs until ``routemaster db stop``.

Binaries: the system's (``pg_ctl`` on ``PATH``, else the newest
``/usr/lib/postgresql/*/bin``), else those shipped in the ``pgserver`` wheel
(``pip install -e '.[embedded]'``). PostgreSQL refuses to run as root, so as
root the server runs as the ``postgres`` system user (created if missing, as a
``routemaster`` system user), keeping only the capability to traverse
directories so the data directory may sit under a private home directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from routemaster.db.statements import fetch_one, run

DATABASE = "routemaster"
_DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = 'routemaster'"
_CREATE_DATABASE = "CREATE DATABASE routemaster"  # in autocommit: not in a transaction
SUPERUSER = "postgres"
START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections

# sizeof(sockaddr_un.sun_path) is 108 on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_SOCKET_NAME = ".s.PGSQL.65535"  # the longest a port number makes it
_HOST = "127.0.0.1"
_PORT_FILE = "routemaster.port"  # in the data directory: the port last used
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")
_REQUIRED_PROGRAMS = ("initdb", "pg_ctl", "postgres")


class EmbeddedUnavailable(RuntimeError):
    """No PostgreSQL binaries were found, or the server could not be started."""


def data_dir_from_environment(environ: Mapping[str, str] | None = None) -> Path:
    """``ROUTEMASTER_DATA_DIR`` (the pgdata folder itself), else one place per user.

    That place is ``$XDG_DATA_HOME/routemaster/pgdata`` (by default
    ``~/.local/share/routemaster/pgdata``), wherever the command is run from.
    """
    env = os.environ if environ is None else environ
    configured = env.get("ROUTEMASTER_DATA_DIR")
    if configured:
        return Path(configured)
    data_home = env.get("XDG_DATA_HOME") or str(
        Path(env.get("HOME") or Path.home()) / ".local/share"
    )
    return Path(data_home) / "routemaster" / "pgdata"


def _has_programs(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in _REQUIRED_PROGRAMS)


def system_binaries() -> Path | None:
    """The directory of the system's PostgreSQL server programs, if it has them."""
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        directory = Path(pg_ctl).resolve().parent
        if _has_programs(directory):
            return directory

    def version(directory: Path) -> tuple[int, ...]:
        digits = re.findall(r"\d+", directory.parent.name)
        return tuple(int(d) for d in digits)

    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for directory in installed:
        if _has_programs(directory):
            return directory
    return None


def pgserver_binaries() -> Path | None:
    """The binaries inside the ``pgserver`` wheel, located without importing it.

    Importing ``pgserver`` has side effects (it sets up its own lock and
    runtime folders); we only borrow its programs.
    """
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent / "pginstall" / "bin"
    return directory if _has_programs(directory) else None


def major_version(bin_dir: Path) -> str:
    """``"16"`` for PostgreSQL 16.4's programs."""
    output = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"(\d+)(?:\.\d+)?", output)
    return found.group(1) if found else "unknown"


def find_binaries(data_dir: Path | None = None) -> Path:
    """The system's programs, else pgserver's; those of the data directory's version if any is."""
    found = [d for d in (system_binaries(), pgserver_binaries()) if d is not None]
    if not found:
        raise EmbeddedUnavailable(
            "No PostgreSQL found: set DATABASE_URL, install PostgreSQL (initdb, pg_ctl), "
            "or `pip install 'routemaster[embedded]'` for the pgserver package"
        )
    made_by = _cluster_version(data_dir) if data_dir is not None else None
    matching = [d for d in found if made_by is not None and major_version(d) == made_by]
    return (matching or found)[0]


def _cluster_version(data_dir: Path) -> str | None:
    try:
        return (data_dir / "PG_VERSION").read_text().strip()
    except OSError:
        return None


def socket_dir_for(data_dir: Path) -> Path:
    """Where the server puts its socket: the data directory itself when the path allows."""
    if _PLAIN_PATH.match(str(data_dir)) and len(str(data_dir / _SOCKET_NAME)) <= _MAX_SOCKET_PATH:
        return data_dir
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"routemaster-pg-{digest}"


@dataclass(frozen=True)
class _OsUser:
    name: str
    uid: int
    gid: int


def _server_os_user() -> _OsUser | None:
    """Who runs the server: ``None`` means the current user (anyone but root)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("ROUTEMASTER_PG_OS_USER", "")
    candidates = [name] if name else ["postgres", "routemaster"]
    for candidate in candidates:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(candidate)
            return _OsUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    created = candidates[-1]
    try:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                created,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        raise EmbeddedUnavailable(
            f"PostgreSQL will not run as root and no user to run it as could be created "
            f"({error}); set ROUTEMASTER_PG_OS_USER to an existing unprivileged user"
        ) from error
    entry = pwd.getpwnam(created)
    return _OsUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _make_traversable(directory: Path) -> None:
    """Let other users traverse (not list) every ancestor of ``directory``.

    Only needed for the pgserver binaries when running as root: PostgreSQL
    checks its own programs with ``access()``, which ignores capabilities.
    """
    for ancestor in [directory, *directory.parents]:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            ancestor.chmod(mode | stat.S_IXOTH)


@dataclass(frozen=True)
class EmbeddedPostgres:
    """One data directory and the programs that serve it."""

    data_dir: Path
    bin_dir: Path

    @classmethod
    def at(cls, data_dir: Path | None = None, bin_dir: Path | None = None) -> EmbeddedPostgres:
        directory = (data_dir if data_dir is not None else data_dir_from_environment()).absolute()
        return cls(directory, bin_dir if bin_dir is not None else find_binaries(directory))

    @property
    def socket_dir(self) -> Path:
        return socket_dir_for(self.data_dir)

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def port(self) -> int:
        """The port of the running server (from ``postmaster.pid``), else the last one used."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            return int(lines[3])
        except (OSError, IndexError, ValueError):
            pass
        try:
            return int((self.data_dir / _PORT_FILE).read_text())
        except (OSError, ValueError) as error:
            raise EmbeddedUnavailable(f"PostgreSQL in {self.data_dir} has never run") from error

    def url(self, database: str = DATABASE) -> str:
        return URL.create(
            "postgresql+psycopg2",
            username=SUPERUSER,
            host=_HOST,
            port=self.port(),
            database=database,
        ).render_as_string(hide_password=False)

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        status = self._pg_ctl(["status"], check=False)
        return status.returncode == 0

    def start(self) -> bool:
        """Initialise and start the server unless it runs already; ``True`` if this started it."""
        with self._lock():
            os_user = _server_os_user()
            if os_user is not None and self.bin_dir == pgserver_binaries():
                _make_traversable(self.bin_dir)
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb(os_user)
            self._check_version()
            if self.is_running():
                started = False
            else:
                self._prepare_socket_dir(os_user)
                port = self._choose_port()
                options = f"-h {_HOST} -p {port} -k {shlex.quote(str(self.socket_dir))}"
                result = self._pg_ctl(
                    [
                        "start",
                        "-w",
                        "-t",
                        str(START_TIMEOUT),
                        "-l",
                        str(self.log_file),
                        "-o",
                        options,
                    ],
                    check=False,
                )
                if result.returncode != 0:
                    raise EmbeddedUnavailable(
                        f"PostgreSQL in {self.data_dir} did not start:\n{result.stdout}"
                        f"{result.stderr}\n{self._log_tail()}"
                    )
                started = True
            self._ensure_database()
        return started

    def stop(self) -> bool:
        """Stop the server if it runs; ``True`` if it was running."""
        with self._lock():
            if not self.is_running():
                return False
            result = self._pg_ctl(["stop", "-w", "-m", "fast"], check=False)
            if result.returncode != 0:
                raise EmbeddedUnavailable(f"pg_ctl stop failed:\n{result.stdout}{result.stderr}")
        return True

    def _check_version(self) -> None:
        made_by, programs = _cluster_version(self.data_dir), major_version(self.bin_dir)
        if made_by != programs:
            raise EmbeddedUnavailable(
                f"The embedded database in {self.data_dir} was made by PostgreSQL {made_by} "
                f"but the PostgreSQL found is {programs}: install PostgreSQL {made_by}, or "
                f"remove {self.data_dir} (its data is lost), or set ROUTEMASTER_DATA_DIR elsewhere"
            )

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start/stop across processes (serve and cron start at the same time)."""
        if not self.data_dir.parent.exists():
            # A folder made for our local state: keep it out of git from the inside.
            self.data_dir.parent.mkdir(parents=True)
            (self.data_dir.parent / ".gitignore").write_text("*\n")
        lock_path = self.data_dir.parent / f".{self.data_dir.name}.lock"
        with open(lock_path, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _initdb(self, os_user: _OsUser | None) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedUnavailable(
                f"{self.data_dir} is not empty but holds no PostgreSQL cluster; "
                "remove it or set ROUTEMASTER_DATA_DIR elsewhere"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os_user is not None:
            os.chown(self.data_dir, os_user.uid, os_user.gid)
        self.data_dir.chmod(0o700)
        result = self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=False,
        )
        if result.returncode != 0:
            raise EmbeddedUnavailable(f"initdb failed:\n{result.stdout}{result.stderr}")

    def _choose_port(self) -> int:
        """The port used last time (at first, one derived from the path) unless another
        program holds it, so a restart keeps every client's URL valid; remembered."""
        port_file = self.data_dir / _PORT_FILE
        try:
            previous = int(port_file.read_text())
        except (OSError, ValueError):
            previous = 0
        digest = hashlib.sha256(str(self.data_dir).encode()).digest()
        wanted = previous or 20000 + int.from_bytes(digest[:4], "big") % 10000
        port = wanted if _port_is_free(wanted) else _free_port()
        if port != previous:
            port_file.write_text(f"{port}\n")
            port_file.chmod(0o644)
        return port

    def _prepare_socket_dir(self, os_user: _OsUser | None) -> None:
        if self.socket_dir == self.data_dir:
            return
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        if os_user is not None:
            os.chown(self.socket_dir, os_user.uid, os_user.gid)

    def _ensure_database(self) -> None:
        engine = sa.create_engine(
            self.url("postgres"), poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        try:
            with engine.connect() as connection:
                if fetch_one(connection, _DATABASE_EXISTS) is None:
                    run(connection, _CREATE_DATABASE)
        finally:
            engine.dispose()

    def _pg_ctl(self, args: Sequence[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        return self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args], check=check
        )

    def _run(self, command: Sequence[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        os_user = _server_os_user()
        if os_user is not None:
            command = [
                "setpriv",
                f"--reuid={os_user.uid}",
                f"--regid={os_user.gid}",
                "--init-groups",
                "--inh-caps=+dac_read_search",
                "--ambient-caps=+dac_read_search",
                *command,
            ]
        # pg_ctl start leaves the server holding inherited pipes open: send its output to files.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            result = subprocess.run(
                command, stdout=out, stderr=err, text=True, check=False, stdin=subprocess.DEVNULL
            )
            out.seek(0)
            err.seek(0)
            completed = subprocess.CompletedProcess(
                command, result.returncode, out.read(), err.read()
            )
        if check:
            completed.check_returncode()
        return completed

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _port_is_free(port: int) -> bool:
    """Whether a server could listen on it now (connections in TIME_WAIT do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((_HOST, 0))
        port: int = probe.getsockname()[1]
    return port


def embedded_database_url(data_dir: Path | None = None) -> str:
    """Start (or reuse) the private server and return the URL of its ``routemaster`` database."""
    server = EmbeddedPostgres.at(data_dir)
    server.start()
    return server.url()
