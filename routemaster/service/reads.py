"""Reads of the store that have no rule of their own, for the faces: the delivery log and the
label counts per state.

Each is the store's function run in one read transaction
(:func:`routemaster.service.transactions.read`): the faces call it with the
:class:`~routemaster.app.App` where the store takes a connection. A read with
a rule (what a label's explanation reads, a listing's paging) is a function
of the service module of its concept instead.
"""

from __future__ import annotations

from routemaster.app import App
from routemaster.db import counts, deliveries
from routemaster.db.counts import StateCount
from routemaster.db.deliveries import Delivery, DeliveryFilter
from routemaster.db.nodes import ROUTE_OPTION, ROUTE_WRITES_OPTION, NodeRoute, nodes_of
from routemaster.db.plumbing.database import distributed
from routemaster.service.transactions import label_read, read

__all__ = [
    "Delivery",
    "DeliveryFilter",
    "NodeRoute",
    "StateCount",
    "deliveries_of_label",
    "label_read_routes",
    "matching_deliveries",
    "recent_failures",
    "state_counts",
]

deliveries_of_label = label_read(deliveries.of_label)
"""A label's calls, newest first, below the position ``before`` (none: from the newest)."""

matching_deliveries = read(deliveries.matching)
"""Every call a filter keeps, newest first, below the position ``before``."""

recent_failures = read(deliveries.recent_failures)
"""The latest failed calls, newest first."""

state_counts = read(counts.in_machine)
"""How many live labels, and how many of them errored, are in each state of one machine."""


def label_read_routes(app: App) -> tuple[str, list[NodeRoute]]:
    """Where this process sends a read of one label: ``"one server"``, ``"off"``
    (``ROUTEMASTER_ROUTE_READS=0`` on Citus) or ``"nodes"``, with each node that holds shards."""
    if not distributed(app.db):
        return "one server", []
    nodes = nodes_of(app.db)
    if nodes is None or app.db.get_execution_options().get(ROUTE_OPTION) is False:
        return "off", []
    return "nodes", nodes.routes()


def label_write_route(app: App) -> str:
    """Where this process sends a write of one label: ``"one server"``, ``"off"``
    (``ROUTEMASTER_ROUTE_WRITES=0`` on Citus) or ``"nodes"`` (the node holding it)."""
    if not distributed(app.db):
        return "one server"
    if app.db.get_execution_options().get(ROUTE_WRITES_OPTION) is False:
        return "off"
    return "nodes"
