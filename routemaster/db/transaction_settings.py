"""What each transaction of a process sets: its statement timeout, and on history writes its
machine versions.

Behind a pooler in transaction mode (PgBouncer ``pool_mode = transaction``,
Supavisor, Neon's pooled endpoint) each transaction may run on another
server connection, and one server connection serves many clients in turn:
a setting made once per connection (the ``options`` startup parameter, a
``SET`` or a session ``set_config``) is refused, lost, or applied to another
process's work. So nothing is set per connection.
:mod:`routemaster.db.statements` sends, in the same round trip as the
statement (``SET LOCAL ...; <statement>``):

- in front of the first statement of each transaction (or of a single
  autocommit statement, which the two then share one implicit transaction
  with), :data:`~routemaster.db.statements.PROLOGUE`: ``SET LOCAL
  statement_timeout``, the cheapest form there is (a utility statement with
  an integer, no row to answer: each read costs the serving process about
  as much as with no prologue at all; docs/performance.md). It ends with the
  transaction.
- in front of a statement that inserts history rows, and of no other,
  :data:`~routemaster.db.statements.STAMP`: ``set_config`` of
  ``routemaster.versions`` for the rest of the transaction, which the
  history trigger of migration 0008 stamps each row with. A read never pays
  for the versions.

The values live in one :class:`TransactionSettings` per engine, kept in the
engine's execution options (SQLAlchemy's public per-engine options, which
every connection of the engine reads); what each statement sends is worked
out when a value is set, not per statement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import sqlalchemy as sa

from routemaster.db.statements import NO_PARAMS, PROLOGUE, SETTINGS_OPTION, STAMP, Params
from routemaster.db.versions import versions_setting

__all__ = ["TransactionSettings", "set_statement_timeout", "settings_of", "stamp_versions"]


class TransactionSettings:
    """The values every transaction of one engine sets (see the module's docstring)."""

    def __init__(self) -> None:
        self.statement_timeout_ms = 0  # 0: none
        self.versions = ""  # JSON: machine -> version; empty: none (history.version stays NULL)
        self._refresh()

    def update(
        self, *, statement_timeout_ms: int | None = None, versions: str | None = None
    ) -> None:
        if statement_timeout_ms is not None:
            self.statement_timeout_ms = statement_timeout_ms
        if versions is not None:
            self.versions = versions
        self._refresh()

    def prologue(self, stamps: bool) -> tuple[str, Params]:
        """What a transaction's first statement carries in front, with its parameters."""
        return self._stamping if stamps else self._plain

    def _refresh(self) -> None:
        timeout = {"routemaster_statement_timeout": self.statement_timeout_ms}
        stamp = {"routemaster_versions": self.versions}
        # Whether there is anything to send (a plain engine, as ``plan`` uses, sends nothing).
        self.needed = bool(self.statement_timeout_ms or self.versions)
        # What a statement that writes history carries in front, when it begins no transaction.
        self.stamp: tuple[str, Params] = (STAMP, MappingProxyType(stamp))
        if self.statement_timeout_ms:
            self._plain: tuple[str, Params] = (PROLOGUE, MappingProxyType(timeout))
            self._stamping = (PROLOGUE + STAMP, MappingProxyType({**timeout, **stamp}))
        else:
            self._plain, self._stamping = ("", NO_PARAMS), self.stamp


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
    milliseconds = max(1, round(seconds * 1000)) if seconds else 0
    settings_of(engine).update(statement_timeout_ms=milliseconds)


def stamp_versions(
    engine: sa.Engine, versions: Mapping[str, int], continuing: Iterable[str] = ()
) -> None:
    """History rows written through ``engine`` from now on carry ``versions`` (machine: version).

    ``continuing``: the machines whose rows carry the label's own version instead (SPEC E4).
    """
    setting = versions_setting(versions, continuing) if versions else ""
    settings_of(engine).update(versions=setting)
