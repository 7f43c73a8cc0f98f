"""What each transaction of a process sets first: its statement timeout.

Behind a pooler in transaction mode (PgBouncer ``pool_mode = transaction``,
Supavisor, Neon's pooled endpoint) each transaction may run on another
server connection, and one server connection serves many clients in turn:
a setting made once per connection (the ``options`` startup parameter, a
``SET`` or a session ``set_config``) is refused, lost, or applied to another
process's work. So nothing is set per connection. Every transaction starts
with :data:`~routemaster.db.statements.PROLOGUE`, which sets the timeout
with ``SET LOCAL`` (it ends with the transaction); on Citus,
:data:`~routemaster.db.statements.CITUS_PROLOGUE` also keeps a statement across
the shards on one connection per worker.
:mod:`routemaster.db.statements` sends it in front of the first statement
of each transaction, in the same round trip
(``SET LOCAL ...; <statement>``), and in front of a single
autocommit statement, which the two then share one implicit transaction
with. The statement runs under the timeout. (The machine versions history
rows carry are parameters of the statements since migration 0017:
:mod:`routemaster.db.history`.)

The values live in one :class:`TransactionSettings` per engine, kept in the
engine's execution options (SQLAlchemy's public per-engine options, which
every connection of the engine reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from routemaster.db.statements import SETTINGS_OPTION

__all__ = ["TransactionSettings", "set_statement_timeout", "settings_of"]


@dataclass
class TransactionSettings:
    """The values every transaction of one engine sets (see the module's docstring)."""

    statement_timeout_ms: int = 0  # 0: none
    # On Citus (set once the database is known to be distributed): CITUS_PROLOGUE.
    one_connection_per_worker: bool = False

    @property
    def params(self) -> dict[str, str]:
        """:data:`~routemaster.db.statements.PROLOGUE`'s parameters."""
        return {"routemaster_statement_timeout": str(self.statement_timeout_ms)}

    @property
    def needed(self) -> bool:
        """Whether there is anything to set (a plain engine, as ``plan`` uses, sends nothing)."""
        return bool(self.statement_timeout_ms) or self.one_connection_per_worker


def settings_of(engine: sa.Engine) -> TransactionSettings:
    """``engine``'s settings, made (empty) on first use."""
    found = engine.get_execution_options().get(SETTINGS_OPTION)
    if isinstance(found, TransactionSettings):
        return found
    settings = TransactionSettings()
    engine.update_execution_options(**{SETTINGS_OPTION: settings})
    return settings


def set_statement_timeout(engine: sa.Engine, seconds: float | None) -> None:
    """Every transaction of ``engine`` runs each statement for at most ``seconds`` (0: no limit)."""
    settings = settings_of(engine)
    settings.statement_timeout_ms = max(1, round(seconds * 1000)) if seconds else 0
