"""Pauses with an end (``{"until": ...}``): when a paused label resumes by itself.

Statements are written and run as :mod:`routemaster.db.statements` says.
"""

from __future__ import annotations

import datetime
from typing import cast

import sqlalchemy as sa

from routemaster.db.keys import label_key, shard_key
from routemaster.db.statements import fetch_one


def paused_until(conn: sa.Connection, state_machine: str, name: str) -> datetime.datetime | None:
    params = {
        "sm": state_machine,
        "name": name,
        "key": label_key(name),
        "shard_key": shard_key(name),
    }
    row = fetch_one(conn, _PAUSED_UNTIL, params)
    return None if row is None else cast(datetime.datetime | None, row[0])


# One label is found through the primary key (``name_key``, ``shard_key``) and checked by its
# full name.


_PAUSED_UNTIL = """
    SELECT paused_until FROM labels
    WHERE shard_key = %(shard_key)s AND state_machine = %(sm)s AND name_key = %(key)s
      AND name = %(name)s AND paused
    """
