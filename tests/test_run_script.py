"""``./scripts/run`` (README's run command) supervises its processes and explains failures.

Run against the test database with the current Python (``ROUTEMASTER_NO_INSTALL``),
on free ports, with a config that talks to its own demo receiver.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import free_port

REPOSITORY = Path(__file__).resolve().parents[1]
RUN = REPOSITORY / "scripts" / "run"


@pytest.fixture
def run_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    receiver = f"127.0.0.1:{free_port()}"
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
        ROUTEMASTER_BIND=f"127.0.0.1:{free_port()}",
        ROUTEMASTER_RECEIVER_BIND=receiver,
        ROUTEMASTER_WORKERS="1",
    )
    return env


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
    assert running.stdout is not None
    deadline = time.monotonic() + 60
    while "routemaster is running on" not in (line := running.stdout.readline()):
        assert line and time.monotonic() < deadline, "scripts/run did not report running"
    children = _children(running.pid)
    [receiver] = [pid for pid, command in children.items() if "demo_receiver.py" in command]
    servers = [pid for pid, command in children.items() if "-m routemaster" in command]
    assert len(servers) == 2  # serve and cron
    os.kill(receiver, signal.SIGKILL)
    output, _ = running.communicate(timeout=60)
    assert running.returncode != 0
    assert "routemaster stopped: receiver ended; stopping the rest" in output
    for pid in servers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.slow
def test_ctrl_c_stops_everything_and_says_the_service_stopped(run_env: dict[str, str]) -> None:
    process = subprocess.Popen(
        [str(RUN)],
        cwd=REPOSITORY,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while "routemaster is running on" not in (line := process.stdout.readline()):
            assert line and time.monotonic() < deadline, "scripts/run did not report running"
        children = _children(process.pid)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group at once
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.communicate(timeout=30)
    assert "routemaster stopped (Ctrl-C)." in output
    assert "stopping the rest" not in output and " ended" not in output
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
