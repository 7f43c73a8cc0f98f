"""Whether the database answers, and what a failure of it means to a client.

The faces never touch the store: the health check asks here, and the error
handlers turn a :data:`StoreError` into an answer through :func:`describe_failure`.
"""

from __future__ import annotations

import sqlalchemy as sa

from routemaster.app import App
from routemaster.db.errors import DatabaseFailure, Kind, describe_failure
from routemaster.db.listings import ping

__all__ = ["DatabaseFailure", "Kind", "StoreError", "database_answers", "describe_failure"]

StoreError = sa.exc.SQLAlchemyError
"""What any failure of the database raises (a statement refused, the server unreachable...)."""


def database_answers(app: App) -> bool:
    """True when a pooled connection answers a ping."""
    try:
        ping(app.db)
    except StoreError:
        return False
    return True
