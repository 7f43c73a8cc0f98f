"""schemathesis against the real ``serve`` and the ``/openapi.json`` it serves.

Every check, the stateful phase on, without tokens and with an all-scopes
token: no server error, no status, content type or body outside the
document, no request the document calls valid refused except where it says
why (``tests/api/schemathesis.toml``). Bounded: a fixed seed and a few
examples per operation, so it runs in well under a minute; run the command
it prints with a larger ``-n`` to search further.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster.auth import SCOPES
from tests.api.conftest import CONFIG_PATH
from tests.api.tokens import token_secret, tokens_layer
from tests.serving import serving

SETTINGS = Path(__file__).with_name("schemathesis.toml")
SEED = "27"
EXAMPLES = "6"
# Streams that never end; a route that fails on purpose; the empty label name, always refused.
EXCLUDED = r"/changes$|^/check-loggers$|/labels/$"


def schemathesis(base: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(SETTINGS),
        "run",
        f"{base}/openapi.json",
        "--checks",
        "all",
        "--phases",
        "coverage,fuzzing,stateful",
        "--seed",
        SEED,
        "--max-examples",
        EXAMPLES,
        "--exclude-path-regex",
        EXCLUDED,
        "--generation-allow-x00",
        "false",
        "--request-timeout",
        "10",
        "--no-color",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def _passed(run: subprocess.CompletedProcess[str]) -> None:
    summary = run.stdout[-3000:]
    print(summary)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
    assert " passed" in summary and "failure" not in summary.split("Test cases:")[-1], summary


@pytest.mark.timeout(300)
def test_the_document_holds_for_every_request_without_tokens(
    database_url: str, db_engine: sa.Engine
) -> None:
    with serving(CONFIG_PATH, database_url) as base:
        _passed(schemathesis(base))


@pytest.mark.timeout(300)
def test_the_document_holds_for_every_request_with_an_all_scopes_token(
    database_url: str, db_engine: sa.Engine, tmp_path: Path
) -> None:
    secret = token_secret(db_engine, "fuzzer", *SCOPES)
    with serving(CONFIG_PATH, database_url, layers=[tokens_layer(tmp_path)]) as base:
        _passed(schemathesis(base, "--header", f"Authorization: Bearer {secret}"))
