"""Searches from the faces: ``?where=`` compiled for the database, with the listing's filters.

A search expression that does not compile, or that the database could not
answer as a gate would, is :class:`~routemaster.service.refusals.Malformed` (a
400) whose message is the compile error with its caret line. The statements
run under the engine's statement timeout; a search cut off by it is answered
504 by the database error handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db.listings import label_page
from routemaster.db.search import Search, not_on_version, search_count, search_page
from routemaster.search import ConditionSyntaxError, compile_search
from routemaster.service.refusals import Malformed
from routemaster.service.transactions import read, reading

__all__ = [
    "Listing",
    "Search",
    "count_matches",
    "listing",
    "listing_search",
    "not_on_version",
    "page_of_matches",
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


count_matches = read(search_count)


page_of_matches = read(search_page)


@dataclass(frozen=True)
class Listing:
    """A machine's labels by name with the listing's filters, and a search expression or none.

    Without an expression the listing reads the labels by name; with one,
    the compiled search does (both order by name, so pages follow on).
    """

    app: App
    search: Search
    expression: bool

    def page(self, *, after: str, limit: int) -> list[tuple[str, str]]:
        """``(name, state)`` of up to ``limit`` labels after the name ``after``."""
        if self.expression:
            return page_of_matches(self.app, self.search, after=after, limit=limit)
        search = self.search
        with reading(self.app) as conn:
            return label_page(
                conn,
                search.machine,
                after=after,
                limit=limit,
                state=search.state,
                errored=search.errored,
                prefix=search.prefix,
            )

    def count(self) -> int:
        return count_matches(self.app, self.search)


def listing(
    app: App,
    machine: StateMachine,
    where: str | None,
    *,
    state: str | None = None,
    errored: bool = False,
    prefix: str = "",
) -> Listing:
    """The labels of ``machine`` the filters keep (and ``where``, compiled: or Malformed)."""
    search = listing_search(app, machine, where, state=state, errored=errored, prefix=prefix)
    return Listing(app, search, where is not None)
