"""Token changes reach every running process with ``DATABASE_URL`` alone (SPEC F3).

A token made by ``routemaster token create`` is accepted at its first use,
within milliseconds, by every API process of a running ``serve``, whether
its database URL is PostgreSQL (the processes hear the change) or PgBouncer
in transaction mode (they poll every 10 s, so only the look-up of a token
they do not know yet can accept it). A revoked token is refused at once
where the processes listen, within the poll interval where they poll.
Unknown secrets cannot turn into database load: look-ups are rate-limited
and a key id found missing is not looked up again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from routemaster.auth.cache import MISS_READS, TokenCache
from routemaster.auth.token_secrets import new_secret
from tests.api.tokens import tokens_layer
from tests.pooler import running_pgbouncer
from tests.serving import REPOSITORY, serve_process
from tests.waiting import wait_until

POLL = 10.0  # the processes' poll interval: far longer than any first use here
SLACK = 2.0

CONFIG = """
state_machines:
  m:
    states:
      - gate: start
        exit_condition: false
"""


@contextlib.contextmanager
def _database(kind: str, direct_database_url: str) -> Iterator[str]:
    if kind == "postgresql":
        yield direct_database_url
    else:
        with running_pgbouncer(direct_database_url, pool_size=5) as url:
            yield url


def _alone(url: str, poll: float) -> dict[str, str]:
    """The environment of a process given ``DATABASE_URL`` and nothing else of ours."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DB_", "ROUTEMASTER_")) and key != "DATABASE_URL"
    }
    return {**environment, "DATABASE_URL": url, "ROUTEMASTER_POLL_INTERVAL": str(poll)}


def _token(config: list[str], env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "routemaster", *config, "token", *args]
    return subprocess.run(
        command, cwd=REPOSITORY, env=env, capture_output=True, text=True, check=True, timeout=60
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "pgbouncer"])
def test_a_new_token_is_accepted_at_its_first_use_and_a_revoked_one_refused(
    kind: str, direct_database_url: str, db_engine: sa.Engine, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    layer = tokens_layer(tmp_path)
    with _database(kind, direct_database_url) as url:
        env = _alone(url, POLL)
        with serve_process(
            config,
            url,
            "--workers",
            "2",
            env={"ROUTEMASTER_DIRECT_DATABASE_URL": "", "ROUTEMASTER_POLL_INTERVAL": str(POLL)},
            layers=[layer],
        ) as (_, base):
            labels = f"{base}/state-machines/m/labels"
            layered = ["-c", str(config), "-c", str(layer)]

            def answers(secret: str) -> list[int]:
                """Six requests on new connections: gunicorn hands them to either process."""
                headers = {"Authorization": f"Bearer {secret}"}
                return [
                    requests.get(labels, headers=headers, timeout=10).status_code for _ in "123456"
                ]

            secrets = []
            for number in range(3):
                made = _token(layered, env, "create", f"t{number}", "--scope", "read")
                secrets.append(made.stdout.strip())
                assert answers(secrets[-1]) == [200] * 6, made.stderr
            revoked = _token(layered, env, "revoke", "t0")
            at = time.monotonic()
            if kind == "postgresql":  # every process heard it, and said so before the command ended
                assert "2 running API process(es) confirmed" in revoked.stderr
                assert answers(secrets[0]) == [401] * 6
            else:
                assert "within their poll interval" in revoked.stderr
                wait_until(
                    lambda: answers(secrets[0]) == [401] * 6,
                    "t0 refused by every process",
                    timeout=POLL + SLACK,
                )
                assert time.monotonic() - at < POLL + SLACK
            assert answers(secrets[1]) == [200] * 6


def test_unknown_secrets_are_looked_up_at_most_a_few_times_a_second(
    db_engine: sa.Engine,
) -> None:
    looked_up: list[str] = []

    @sa.event.listens_for(db_engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "WHERE key_id" in statement:
            looked_up.append(statement)

    cache = TokenCache(db_engine, poll_every=POLL)
    try:
        assert cache.wait_until_current(10)
        started = time.monotonic()
        for _ in range(200):
            assert cache.authenticate(new_secret().secret) is None
        assert looked_up
        if time.monotonic() - started < 1.0:
            assert len(looked_up) <= MISS_READS
    finally:
        cache.close()
    looked_up.clear()
    cache = TokenCache(db_engine, poll_every=POLL)  # a fresh process's rate
    try:
        assert cache.wait_until_current(10)
        unknown = new_secret().secret
        for _ in range(50):
            assert cache.authenticate(unknown) is None
        assert len(looked_up) == 1  # a key id found missing is not looked up again
    finally:
        cache.close()
