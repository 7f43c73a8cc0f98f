"""What went wrong with the database, in words fit for a client and a log line.

A DBAPI exception's text carries the SQL statement, often its parameters
(label metadata) and sometimes the server's address; none of that belongs in
an HTTP response, and a log line per failed request should be one line. Here
an exception becomes a :class:`DatabaseFailure`: a kind, the server's own
short message (``message_primary``, which names no statement), the SQLSTATE.

Only a failure to reach the server is :attr:`Kind.UNREACHABLE`; a statement
cut off by ``statement_timeout``, a value the server refuses or a conflict
between transactions are the database answering, and are told apart.

On Citus, a statement that Citus runs in steps (a claim's CTEs) hands each
step's rows to the next as an *intermediate result* sent to the nodes that
the plan named. When a shard move (``citus_move_shard_placement``) commits
while such a statement waits for the shard's lock, its later step runs on the
shard's new node, where the result was never sent: Citus fails the statement
with SQLSTATE ``CIINF`` ("could not find the intermediate result file"), and
the transaction is rolled back. That is :attr:`Kind.MOVED`: nothing was done,
and the same transaction run again is planned on the new placement
(:func:`moved_during`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import sqlalchemy as sa

# SQLSTATE classes and codes (PostgreSQL appendix A) that mean "not reachable".
_CONNECTION_CLASS = "08"
_SHUTTING_DOWN = {"57P01", "57P02", "57P03"}  # admin/crash shutdown, cannot connect now
_QUERY_CANCELED = "57014"  # statement_timeout (or a cancel request)
_INTERMEDIATE_RESULT_NOT_FOUND = "CIINF"  # Citus: a shard moved under a statement run in steps


class Kind(enum.Enum):
    UNREACHABLE = "unreachable"  # no connection could be made or it broke
    BUSY = "busy"  # no pooled connection became free in time
    TIMEOUT = "timeout"  # a statement ran longer than statement_timeout
    REFUSED = "refused"  # a value the server cannot store (SQLSTATE class 22)
    TOO_LARGE = "too large"  # a server limit (class 54: sizes, nesting, index rows)
    CONFLICT = "conflict"  # serialization failure or deadlock (class 40)
    MOVED = "moved"  # Citus: a shard moved while the statement ran (module docstring)
    OTHER = "other"


@dataclass(frozen=True)
class DatabaseFailure:
    kind: Kind
    detail: str  # the server's one-line message, or a description; never SQL
    sqlstate: str | None = None

    def log_line(self) -> str:
        code = f" [{self.sqlstate}]" if self.sqlstate else ""
        return f"database {self.kind.value}{code}: {self.detail}"


def describe_failure(error: BaseException) -> DatabaseFailure:
    """Classify ``error`` (any SQLAlchemy or DBAPI exception) without its SQL or parameters."""
    if isinstance(error, sa.exc.TimeoutError):
        return DatabaseFailure(Kind.BUSY, "no pooled connection became free in time")
    if isinstance(error, sa.exc.DisconnectionError):
        return DatabaseFailure(Kind.UNREACHABLE, "the connection was lost")
    original = getattr(error, "orig", None) or error
    sqlstate: str | None = getattr(original, "pgcode", None)
    diag = getattr(original, "diag", None)
    primary: str | None = getattr(diag, "message_primary", None)
    if sqlstate is None:
        # The driver's own errors: a refused or broken connection has no SQLSTATE.
        if isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError) or getattr(
            error, "connection_invalidated", False
        ):
            return DatabaseFailure(Kind.UNREACHABLE, _first_line(original))
        return DatabaseFailure(Kind.OTHER, type(original).__name__)
    if sqlstate.startswith(_CONNECTION_CLASS) or sqlstate in _SHUTTING_DOWN:
        return DatabaseFailure(Kind.UNREACHABLE, primary or _first_line(original), sqlstate)
    detail = primary or type(original).__name__
    if sqlstate == _QUERY_CANCELED:
        return DatabaseFailure(Kind.TIMEOUT, detail, sqlstate)
    if sqlstate == _INTERMEDIATE_RESULT_NOT_FOUND:
        return DatabaseFailure(Kind.MOVED, detail, sqlstate)
    kinds = {"22": Kind.REFUSED, "54": Kind.TOO_LARGE, "40": Kind.CONFLICT}
    return DatabaseFailure(kinds.get(sqlstate[:2], Kind.OTHER), detail, sqlstate)


def moved_during(error: BaseException) -> bool:
    """Whether ``error`` is a shard move cutting a statement short (:attr:`Kind.MOVED`): its
    transaction was rolled back, and running it again is safe."""
    original = getattr(error, "orig", None) or error
    return getattr(original, "pgcode", None) == _INTERMEDIATE_RESULT_NOT_FOUND


def _first_line(error: BaseException) -> str:
    """The first line of a driver message (libpq's connection errors run to several)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
