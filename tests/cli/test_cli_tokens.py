"""``routemaster token create | list | revoke`` and the metrics options, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from routemaster.auth.token_secrets import hash_secret, key_id_of
from routemaster.cli import cli
from routemaster.cli.environment import settings_from_environment
from routemaster.cli.metrics import split_bind

CONFIG = """\
state_machines:
  user:
    states:
      - gate: start
        exit_condition: false
api:
  authentication: tokens
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def token(config: Path, database_url: str, db_engine: sa.Engine) -> TokenCommand:
    return TokenCommand(config, database_url)


class TokenCommand:
    def __init__(self, config: Path, database_url: str) -> None:
        self.config = config
        self.database_url = database_url

    def __call__(self, *args: str) -> Result:
        return CliRunner().invoke(
            cli,
            ["-c", str(self.config), "token", *args],
            env={"DATABASE_URL": self.database_url, "DB_HOST": None},
        )


def test_create_prints_the_secret_once_and_stores_only_its_hash(
    token: TokenCommand, db_engine: sa.Engine
) -> None:
    created = token("create", "deploy", "--scope", "write", "--scope", "read")
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    key_id = key_id_of(secret)
    assert key_id is not None
    assert "Created token 'deploy' with scopes read, write" in created.stderr
    with db_engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM api_tokens")).one()
    assert (row.name, row.key_id, sorted(row.scopes)) == ("deploy", key_id, ["read", "write"])
    assert row.secret_hash == hash_secret(secret)
    assert secret not in str(tuple(row))
    listed = token("list")
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[1].split()[:2] == ["deploy", "read,write"]
    assert "never" in listed.stdout
    assert secret not in listed.output


def test_bad_names_scopes_and_duplicates_are_refused(token: TokenCommand) -> None:
    assert token("create", "ci", "--scope", "read").exit_code == 0
    duplicate = token("create", "ci", "--scope", "read")
    assert duplicate.exit_code == 1
    assert "a token called 'ci' exists; revoke it first" in duplicate.stderr
    unknown_scope = token("create", "x", "--scope", "root")
    assert unknown_scope.exit_code == 2
    assert (
        "'root' is not one of 'read', 'write', 'operate', 'work', 'admin'" in unknown_scope.stderr
    )
    assert token("create", "x").exit_code == 2  # a scope is required
    blank = token("create", " padded ", "--scope", "read")
    assert blank.exit_code == 1
    assert "printable characters" in blank.stderr


def test_revoke_forgets_the_token(token: TokenCommand) -> None:
    token("create", "ci", "--scope", "read")
    revoked = token("revoke", "ci")
    assert revoked.exit_code == 0
    assert "Revoked token 'ci'" in revoked.stderr
    assert "No tokens." in token("list").stderr
    missing = token("revoke", "ci")
    assert missing.exit_code == 1
    assert "no token called 'ci'" in missing.stderr


def test_an_unreachable_database_is_one_line(config: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["-c", str(config), "token", "list"],
        env={"DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:1/x"},
    )
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(
        "Error: cannot use the database at postgresql+psycopg2://u:***@"
    )
    assert "hunter2" not in result.output


def test_metrics_settings_and_bind_addresses() -> None:
    assert settings_from_environment({"ROUTEMASTER_METRICS": "off"}).metrics is False
    assert settings_from_environment({"ROUTEMASTER_METRICS": "1"}).metrics is True
    with pytest.raises(Exception, match="ROUTEMASTER_METRICS='maybe'"):
        settings_from_environment({"ROUTEMASTER_METRICS": "maybe"})
    assert split_bind("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert split_bind("[::1]:9100") == ("::1", 9100)
    assert split_bind(":9100") == ("0.0.0.0", 9100)
    for bad in ("9100", "host:", "host:99999", "host:http"):
        with pytest.raises(Exception, match="expected HOST:PORT"):
            split_bind(bad)
