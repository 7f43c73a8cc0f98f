"""Every statement that writes history names the row's shard key, version and transaction.

Since migration 0017 no trigger or default completes a history row: on Citus a
trigger runs on the worker's shard (where the coordinator's settings are not
seen) and a default of a pushed-down ``INSERT ... SELECT`` takes the worker's
transaction id. So every writer names them (routemaster/db/history.py says how).
"""

from __future__ import annotations

import re

from tests.db.test_statement_text import STATEMENTS

# The INSERT's column list, up to the closing parenthesis.
HISTORY_INSERT = re.compile(r"INSERT INTO history \(([^)]*)\)", re.IGNORECASE)


def test_every_history_writer_names_shard_key_version_and_xact_id() -> None:
    writers = {
        name: [set(re.split(r"[\s,]+", found.strip())) for found in HISTORY_INSERT.findall(sql)]
        for name, sql in STATEMENTS
    }
    writers = {name: lists for name, lists in writers.items() if lists}
    assert "transitions._APPEND" in writers and "transitions._INSERT" in writers
    for name, column_lists in writers.items():
        for columns in column_lists:
            missing = {"shard_key", "version", "xact_id"} - columns
            assert not missing, f"{name} writes history without {sorted(missing)}"


def test_every_history_writer_takes_the_transaction_id_from_the_coordinator() -> None:
    for name, sql in STATEMENTS:
        if HISTORY_INSERT.search(sql):
            assert "routemaster_xact_id()" in sql, name
