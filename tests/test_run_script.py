"""``./scripts/run`` (README's run command) supervises its processes and explains failures.

Run against the test database with the current Python (``ROUTEMASTER_NO_INSTALL``),
on free ports, with a config that talks to its own demo receiver.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import free_port
from tests.waiting import wait_until

REPOSITORY = Path(__file__).resolve().parents[1]
RUN = REPOSITORY / "scripts" / "run"


@pytest.fixture
def run_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    api_port, receiver_port = _two_free_ports()
    receiver = f"127.0.0.1:{receiver_port}"
    config = tmp_path / "config.yaml"
    config.write_text(
        "state_machines:\n"
        "  m:\n"
        "    states:\n"
        "      - action: notify\n"
        f"        webhook: http://{receiver}/hooks/<label>\n"
        "        next: done\n"
        "      - gate: done\n"
        "        exit_condition: false\n"
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DB_", "ROUTEMASTER_")) and key != "DATABASE_URL"
    }
    env.update(
        PYTHON=sys.executable,
        ROUTEMASTER_NO_INSTALL="1",
        DATABASE_URL=database_url,
        ROUTEMASTER_CONFIG=str(config),
        ROUTEMASTER_BIND=f"127.0.0.1:{api_port}",
        ROUTEMASTER_RECEIVER_BIND=receiver,
        ROUTEMASTER_WORKERS="1",
    )
    return env


class _Output:
    """``scripts/run``'s output, read by a thread as it comes: every line, and whether it said
    it is running (or ended without saying so)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self.lines: list[str] = []
        self.decided = threading.Event()  # "running" said, or the output ended
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.append(line)
            if "routemaster is running on" in line:
                self.decided.set()
        self.decided.set()

    def wait_running(self) -> None:
        """Until the script says it runs; fails with its output if it ended without.

        No timer of the test's own decides: the script gives up by itself (its
        ``GET /`` probes, then one line saying why), and a start that is only slow on
        a loaded machine goes on. The bound below only keeps a hung script from hanging
        the test run.
        """
        assert self.decided.wait(timeout=900), "scripts/run neither ran nor ended in 15 min"
        assert any("routemaster is running on" in line for line in self.lines), self.text()

    def rest(self, timeout: float = 120) -> str:
        """Everything, once the script has ended and its output closed."""
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "scripts/run's output still open:\n" + self.text()
        self._stdout.close()
        return self.text()

    def text(self) -> str:
        return "".join(self.lines)


def _two_free_ports() -> tuple[int, int]:
    """Two free ports, never the same one twice (each free_port() closes its probe)."""
    first = free_port()
    while (second := free_port()) == first:
        pass
    return first, second


def _children(pid: int) -> dict[int, str]:
    """Direct children of ``pid``: their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found[int(entry.name)] = cmdline
    return found


@pytest.fixture
def running(run_env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [str(RUN)],
        cwd=REPOSITORY,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=30)


@pytest.mark.slow
def test_when_one_process_ends_all_stop_and_it_says_which(
    running: subprocess.Popen[str],
) -> None:
    output = _Output(running)
    output.wait_running()
    children = _children(running.pid)
    [receiver] = [pid for pid, command in children.items() if "demo_receiver.py" in command]
    servers = [pid for pid, command in children.items() if "-m routemaster" in command]
    assert len(servers) == 2  # serve and cron
    os.kill(receiver, signal.SIGKILL)
    assert running.wait(timeout=120) != 0
    assert "routemaster stopped: receiver ended; stopping the rest" in output.rest()
    for pid in servers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "inherited",
    [signal.SIG_DFL, signal.SIG_IGN],
    ids=["from a terminal", "from a supervisor that ignores SIGINT"],
)
def test_ctrl_c_stops_everything_and_says_the_service_stopped(
    run_env: dict[str, str], inherited: signal.Handlers
) -> None:
    """Whatever SIGINT disposition the script inherits (set here, not left to how the test
    run was started: a CI job started with ``&`` from a non-interactive shell ignores it)."""
    process = subprocess.Popen(
        [str(RUN)],
        cwd=REPOSITORY,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )
    try:
        output = _Output(process)
        output.wait_running()
        children = _children(process.pid)
        # gunicorn in a group of its own: told once, by the script (a second signal could
        # leave a gunicorn worker waiting for itself in its quit handler, see scripts/run)
        [serve] = [pid for pid, command in children.items() if " serve " in command]
        assert os.getpgid(serve) == serve
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group at once
        process.wait(timeout=120)
        text = output.rest()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    assert "routemaster stopped (Ctrl-C)." in text, text
    assert "stopping the rest" not in text and " ended" not in text, text
    assert process.returncode == 130
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def _run_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUN)], cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_a_busy_port_is_one_line_and_nothing_is_left_running(run_env: dict[str, str]) -> None:
    host, _, port = run_env["ROUTEMASTER_BIND"].rpartition(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        result = _run_once(run_env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"routemaster did not start: {run_env['ROUTEMASTER_BIND']} is in use by another "
        "program (stop it, or set ROUTEMASTER_BIND=HOST:PORT)"
    ]


@pytest.mark.slow
def test_an_unreachable_database_is_one_line(run_env: dict[str, str]) -> None:
    run_env["DATABASE_URL"] = "postgresql://ann:pw@127.0.0.1:1/nowhere"
    result = _run_once(run_env)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "routemaster did not start: cannot use the database at "
        "postgresql+psycopg2://ann:***@127.0.0.1:1/nowhere: "
    )
    assert "Connection refused" in line


def test_scripts_make_their_own_virtualenv_instead_of_installing_into_the_system(
    tmp_path: Path,
) -> None:
    """A system Python may forbid ``pip install`` (PEP 668): the scripts never ask it to."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "_common.sh").write_text(
        (REPOSITORY / "scripts" / "_common.sh").read_text()
    )
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHON", "VIRTUAL_ENV"}}
    result = subprocess.run(
        [
            "bash",
            "-c",
            "source scripts/_common.sh && ensure_state_dir && choose_python && "
            'echo "$PYTHON" && "$PYTHON" -c "import sys; print(sys.prefix != sys.base_prefix)"',
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path / ".venv" / "bin" / "python"), "True"]


# Stands for the Python the scripts install into: ``-m pip`` is an install that takes its time
# and has a child of its own (as pip's build backends are), both pids written down; anything
# else runs the real Python.
_SLOW_PIP = """#!{python}
import os, subprocess, sys, time
if sys.argv[1:3] == ["-m", "pip"]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["PIP_PIDS"], "a") as pids:
        pids.write(f"{{os.getpid()}} {{child.pid}}\\n")
    time.sleep(600)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_sigterm_during_the_first_install_stops_the_install_too(tmp_path: Path) -> None:
    """A supervisor stops ``./scripts/run`` while it installs: pip does not run on alone."""
    checkout = tmp_path / "checkout"  # a first run: no install stamp yet
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "tests").mkdir()
    for path in ("scripts/run", "scripts/_common.sh", "setup.py", "pyproject.toml"):
        (checkout / path).symlink_to(REPOSITORY / path)
    (checkout / "tests" / "published-plugins.txt").symlink_to(
        REPOSITORY / "tests" / "published-plugins.txt"
    )
    python = tmp_path / "python"
    python.write_text(_SLOW_PIP.format(python=sys.executable))
    python.chmod(0o755)
    pids = tmp_path / "pip.pids"
    log = tmp_path / "run.log"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DB_", "ROUTEMASTER_")) and key not in {"DATABASE_URL"}
    }
    env.update(PYTHON=str(python), PIP_PIDS=str(pids))
    started: list[int] = []
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(checkout / "scripts" / "run")],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
        )
    try:
        wait_until(
            lambda: pids.exists() and pids.read_text().endswith("\n"), "pip started", timeout=60
        )
        started = [int(pid) for pid in pids.read_text().split()]
        os.kill(process.pid, signal.SIGTERM)  # the script alone, as a supervisor does
        process.wait(timeout=60)
        assert "Installing routemaster" in log.read_text()
        assert process.returncode == 143, log.read_text()
        wait_until(lambda: not any(_alive(pid) for pid in started), "pip and its child stopped")
    finally:
        for pid in [process.pid, *started]:  # whatever is left, whichever group it is in
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
