"""The delivery log: ``GET .../labels/{label}/deliveries`` and ``GET /deliveries``.

Newest first, paged with ``limit`` and an opaque ``next`` link (the position
of the last row shown; a page is an index range scan below it).
"""

from __future__ import annotations

import datetime
from typing import Any

import flask

from routemaster import service
from routemaster.api.labels import LABEL
from routemaster.auth import READ
from routemaster.service import reads
from routemaster.service.reads import Delivery, DeliveryFilter
from routemaster.webcore.endpoints import Query, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paging import Page, next_link, page_of
from routemaster.webcore.paths import link
from routemaster.webcore.request_checks import checked_query, utc_time
from routemaster.webcore.responses import delivery_json, json_response

blueprint = flask.Blueprint("deliveries", __name__)

DEFAULT_PAGE = 100
MAX_PAGE = 1000
KINDS = ("webhook", "feed", "subscription")
OUTCOMES = ("delivered", "accepted", "failed", "gone", "timeout", "network", "throttled")

_PAGING = (
    Query(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
        f"Page size (default {DEFAULT_PAGE}).",
    ),
    Query(
        "before",
        {
            "type": "string",
            "pattern": "^[0-9]{1,18}$",
            "x-error": "before must be a position from a `next` link.",
        },
        "Where the page starts (opaque: from `next`).",
    ),
)


@blueprint.get(LABEL + "/deliveries")
@endpoint(
    READ,
    "A label's outbound calls (webhooks, feeds), newest first",
    {200: Reply("DeliveryList"), 400: Reply("Error"), 404: Reply("Error")},
    query=_PAGING,
    tags=("deliveries",),
)
def label_deliveries(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    args = checked_query()
    service.get_label(app, machine, label)  # 404 for a name never created
    limit, before = _paging(args)
    page = page_of(
        lambda n: reads.deliveries_of_label(app, machine.name, label, limit=n, before=before), limit
    )
    return _page(page, limit, link("state-machines", machine.name, "labels", label, "deliveries"))


@blueprint.get("/deliveries")
@endpoint(
    READ,
    "Every outbound call, newest first, filtered",
    {200: Reply("DeliveryList"), 400: Reply("Error")},
    query=(
        Query("kind", {"enum": list(KINDS)}, "Only calls of this kind."),
        Query("outcome", {"enum": list(OUTCOMES)}, "Only calls with this outcome."),
        Query("receiver", {"type": "string"}, "Only calls to this receiver (its id)."),
        Query("since", {"type": "string", "format": "date-time"}, "Started at or after."),
        Query("until", {"type": "string", "format": "date-time"}, "Started before."),
        *_PAGING,
    ),
    tags=("deliveries",),
)
def all_deliveries() -> flask.Response:
    app = routemaster_app()
    args = checked_query()
    where = DeliveryFilter(
        kind=args.get("kind"),
        outcome=args.get("outcome"),
        receiver=args.get("receiver"),
        since=parse_time(args.get("since")),
        until=parse_time(args.get("until")),
    )
    limit, before = _paging(args)
    page = page_of(lambda n: reads.matching_deliveries(app, where, limit=n, before=before), limit)
    names = ("kind", "outcome", "receiver", "since", "until")
    return _page(page, limit, "/deliveries", {name: args[name] for name in names if name in args})


def parse_time(raw: str | None) -> datetime.datetime | None:
    """A time checked as ``format: date-time`` (UTC when it names no offset); None for none."""
    return None if raw is None else utc_time(raw)


def _page(
    page: Page[Delivery], limit: int, path: str, filters: dict[str, str] | None = None
) -> flask.Response:
    body: dict[str, Any] = {"deliveries": [delivery_json(row) for row in page.rows]}
    body["next"] = None
    if page.last is not None:
        query = {**(filters or {}), "limit": str(limit), "before": str(page.last.id)}
        body["next"] = next_link(path, query)
    return json_response(body)


def _paging(args: dict[str, Any]) -> tuple[int, int | None]:
    before = args.get("before")
    return args.get("limit", DEFAULT_PAGE), None if before is None else int(before)
