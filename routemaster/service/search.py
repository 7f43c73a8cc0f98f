"""Searches from the faces: ``?where=`` compiled for the database, with the listing's filters.

A search expression that does not compile, or that the database could not
answer as a gate would, is :class:`~routemaster.service.errors.Malformed` (a
400) whose message is the compile error with its caret line. The statements
run under the engine's statement timeout; a search cut off by it is answered
504 by the database error handler.
"""

from __future__ import annotations

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db.search import Search, not_on_version, search_count, search_page
from routemaster.search import ConditionSyntaxError, compile_search
from routemaster.service.errors import Malformed

__all__ = ["Search", "count_matches", "listing_search", "not_on_version", "page_of_matches"]


def listing_search(
    app: App,
    machine: StateMachine,
    where: str | None,
    *,
    state: str | None = None,
    errored: bool = False,
    prefix: str = "",
) -> Search:
    """The labels of ``machine`` matching ``where`` (none: all) and the filters, or Malformed."""
    if where is None:
        return Search(machine.name, state=state, errored=errored, prefix=prefix)
    if "\x00" in where:
        raise Malformed("A search expression cannot contain NUL characters.")
    try:
        compiled = compile_search(where, app.now())
    except ConditionSyntaxError as error:
        raise Malformed(str(error)) from None
    return Search(
        machine.name, compiled.sql, compiled.params, state=state, errored=errored, prefix=prefix
    )


def count_matches(app: App, search: Search) -> int:
    with app.db.connect() as conn:
        return search_count(conn, search)


def page_of_matches(app: App, search: Search, *, after: str, limit: int) -> list[tuple[str, str]]:
    with app.db.connect() as conn:
        return search_page(conn, search, after=after, limit=limit)
