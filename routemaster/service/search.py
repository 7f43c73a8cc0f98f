"""Searches and listings of labels: ``?where=`` compiled for the database, with the filters.

A search expression that does not compile, or that the database could not
answer as a gate would, is :class:`~routemaster.service.errors.Malformed` (a
400) whose message is the compile error with its caret line. The statements
run under the engine's statement timeout; a search cut off by it is answered
504 by the database error handler.
"""

from __future__ import annotations

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db.listings import StateCount, label_counts, label_page
from routemaster.db.search import Search, search_count, search_page
from routemaster.search import ConditionSyntaxError, compile_search
from routemaster.service.errors import Malformed

__all__ = [
    "Search",
    "StateCount",
    "count_matches",
    "listing_search",
    "page_of_labels",
    "page_of_matches",
    "state_counts",
]


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


def page_of_labels(
    app: App,
    machine: str,
    *,
    after: str,
    limit: int,
    state: str | None,
    errored: bool,
    prefix: str,
) -> list[tuple[str, str]]:
    """A page of the machine's labels by name, ``(name, state)``, with the listing's filters."""
    return label_page(
        app.db, machine, after=after, limit=limit, state=state, errored=errored, prefix=prefix
    )


def state_counts(app: App, machine: str) -> dict[str, StateCount]:
    """How many live labels, and how many of them errored, are in each state."""
    return label_counts(app.db, machine)
