"""Hostile configuration and database URLs: exit 1 with one clear line, in bounded memory.

The YAML cases run the real command in a child process so its peak memory
can be read (``wait4``); the limit checked is the one docs/operations.md
states (200 MiB). The child's time is bounded by a generous kill timeout: a
regression shows up as a hang caught there, not as a timing assertion.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click.testing
import pytest
from click.testing import CliRunner

from routemaster.cli import cli

MAX_RSS_KIB = 200 * 1024
VALID = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: false
"""


def billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 10):
        refs = ",".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def with_match(
    pattern: str, url: str = "http://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.com/!"
) -> str:
    quoted = pattern.replace("'", "''")
    return f"""\
state_machines:
  user:
    webhooks:
      - match: '{quoted}'
        headers: {{Authorization: Bearer x}}
    states:
      - action: notify
        webhook: {url}
        next: done
      - gate: done
        exit_condition: false
"""


HOSTILE: list[tuple[str, bytes, str]] = [
    ("alias bomb", billion_laughs().encode(), "expands to more than 100000 values"),
    ("NUL", b"state_machines:\n  us\x00er: {}\n", "U+0000 is not allowed"),
    ("control character", b"state_machines:\n  us\x1ber: {}\n", "U+001B is not allowed"),
    ("not UTF-8", b"state_machines:\n  caf\xe9: {}\n", "not UTF-8"),
    ("10,000-deep flow", b"x: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "deeper than 64"),
    ("10,000-deep block", b"x:\n" + b"- " * 10_000 + b"leaf\n", "deeper than 64"),
    ("regex nested 10,000 deep", with_match("(" * 10_000 + ")" * 10_000).encode(), "longer than"),
    ("regex nested 60 deep", with_match("(" * 60 + "a" + ")" * 60).encode(), "nests"),
    ("huge repeat count", with_match("a{99999999999999999999}").encode(), "repeats too much"),
    ("repeats multiplied", with_match("((a{1000}){1000}){1000}").encode(), "repeats too much"),
    ("catastrophic regex", with_match("^http://(a|aa)+$").encode(), "catastrophic"),
    ("invalid regex", with_match("(unclosed").encode(), "invalid regular expression"),
    ("huge file", b"# " + b"x" * (5 * 1024 * 1024) + b"\n", "larger than 4 MiB"),
]


# Run from a small fresh interpreter, so the peak RSS read is the command's own
# and not that of the (large) test process it would otherwise be forked from.
MEASURE = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def run_validate(path: Path) -> tuple[int, str, int]:
    """``routemaster -c PATH validate`` in a child: exit code, stderr, peak RSS (KiB).

    Killed after 60 s, so a hang fails the test instead of stalling the suite.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "DB_"))}
    command = [sys.executable, "-m", "routemaster", "-c", str(path), "validate"]
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return result.returncode, result.stderr, int(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("content", "words"), [(c, w) for _, c, w in HOSTILE], ids=[name for name, _, _ in HOSTILE]
)
def test_hostile_yaml_is_one_clear_error_in_bounded_memory(
    tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    code, stderr, peak = run_validate(path)
    assert code == 1, stderr[-2000:]
    assert words in stderr
    assert "Traceback" not in stderr
    assert stderr.startswith(f"{path}:")
    assert peak <= MAX_RSS_KIB, f"{peak} KiB"


def _run(*args: str, env: dict[str, str | None]) -> click.testing.Result:
    names = ("DATABASE_URL", "DB_HOST", "DB_NAME", "DB_USER", "DB_PORT", "DB_PASS")
    environment: dict[str, str | None] = dict.fromkeys(names)
    environment.update(env)
    return CliRunner().invoke(cli, list(args), env=environment, catch_exceptions=False)


MALFORMED = [
    "postgres://u:hunter2@[::1:1/x",
    "postgres://u:hunter2@host:notaport/x",
    "not a url hunter2",
    "mysql://u:hunter2@host/x",
]
UNREACHABLE = "postgresql://u:hunter2@127.0.0.1:9/x"


@pytest.mark.parametrize("command", ["validate", "migrate", "serve", "cron"])
@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_database_url_is_one_line_without_the_password(
    tmp_path: Path, command: str, url: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(VALID)
    result = _run("-c", str(config), command, env={"DATABASE_URL": url})
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "DATABASE_URL" in lines[0]
    assert "hunter2" not in result.output


@pytest.mark.parametrize("command", ["migrate", "serve", "cron"])
def test_an_unreachable_database_is_one_line_without_the_password(
    tmp_path: Path, command: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(VALID)
    result = _run("-c", str(config), command, env={"DATABASE_URL": UNREACHABLE})
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "cannot use the database at postgresql+psycopg2://u:***@127.0.0.1:9/x" in lines[0]
    assert "refused" in lines[0]
    assert "hunter2" not in result.output


def test_validate_with_an_unreachable_database_warns_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(VALID)
    result = _run("-c", str(config), "validate", env={"DATABASE_URL": UNREACHABLE})
    assert result.exit_code == 0
    [warning] = result.stderr.strip().splitlines()
    assert warning.startswith("warning: database at postgresql+psycopg2://u:***@127.0.0.1:9/x")
    assert "hunter2" not in result.output


def test_a_db_port_that_is_not_a_number_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(VALID)
    result = _run(
        "-c", str(config), "migrate", env={"DB_HOST": "h", "DB_PORT": "x", "DB_PASS": "hunter2"}
    )
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: DB_PORT must be a port number, got 'x'"
