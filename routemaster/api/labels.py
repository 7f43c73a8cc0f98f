"""The label endpoints: create, read, merge metadata, delete, list, history.

Handlers stay thin: parse and check the request, call the label core
(:mod:`routemaster.service`), shape the JSON. The label's state in a response
is where the label is after the request's own processing (a metadata trigger
may have moved it through gates).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import flask
from werkzeug.exceptions import BadRequest

from routemaster import service
from routemaster.app import App
from routemaster.auth import READ, WRITE
from routemaster.config.model import StateMachine
from routemaster.machine.definitions import version_of_label
from routemaster.service.children import parent_of
from routemaster.service.search import listing
from routemaster.webcore.endpoints import Query, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paging import next_link, page_of
from routemaster.webcore.paths import link
from routemaster.webcore.request_checks import checked_body, checked_query
from routemaster.webcore.responses import isoformat, json_response

blueprint = flask.Blueprint("labels", __name__)

MAX_PAGE_SIZE = 10_000
STREAM_BATCH = 1_000

LABEL = "/state-machines/<name:sm>/labels/<name:label>"


@blueprint.get("/state-machines/<name:sm>/labels")
@endpoint(
    READ,
    "Live labels by name: all of them, or a page",
    {
        200: Reply("LabelListOrCount", description="The labels, or with ?count=true their number"),
        400: Reply("Error", description="A bad parameter, or a search expression that fails"),
        404: Reply("Error"),
        504: Reply("Error", description="The search ran past the statement timeout"),
    },
    query=(
        Query("state", {"type": "string"}, "Only labels in this state."),
        Query(
            "where",
            {"type": "string"},
            "Only labels for which this exit-condition expression holds, evaluated by the "
            "database over metadata and history (see docs/search.md).",
        ),
        Query("count", {"type": "boolean"}, 'true: answer {"count": N} over all matches.'),
        Query(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
            "Page size; without it the whole listing is streamed.",
        ),
        Query("after", {"type": "string"}, "Start after this label name (from `next`)."),
        Query(
            "errored",
            {"type": "boolean"},
            "true: only errored labels (actions whose deliveries gave up).",
        ),
        Query("prefix", {"type": "string"}, "Only labels whose name starts with this."),
    ),
    tags=("labels",),
)
def list_labels(sm: str) -> flask.Response:
    """All live labels by name: streamed in batches, or one page with ``?limit=``.

    ``?state=S`` keeps the labels in ``S``, ``?errored=true`` the errored
    ones, ``?prefix=P`` those whose name starts with ``P``; they combine.
    """
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    args = checked_query()
    state: str | None = args.get("state")
    prefix: str = args.get("prefix", "")
    errored: bool = args.get("errored", False)
    where: str | None = args.get("where")
    limit: int | None = args.get("limit")
    labels = link("state-machines", machine.name, "labels")
    found = listing(app, machine, where, state=state, errored=errored, prefix=prefix)
    if args.get("count"):
        return json_response({"count": found.count()})
    after: str = args.get("after", "")
    if limit is not None:
        page = page_of(lambda size: found.page(after=after, limit=size), limit)
        body: dict[str, Any] = {
            "labels": [{"name": name, "state": label_state} for name, label_state in page.rows],
            "create": labels + "/:name",
        }
        if page.last is not None:
            query = {"limit": str(limit), "after": page.last[0]}
            if state is not None:
                query["state"] = state
            if errored:
                query["errored"] = "true"
            if prefix:
                query["prefix"] = prefix
            if where is not None:
                query["where"] = where
            body["next"] = next_link(labels, query)
        return json_response(body)
    # Fetched before the response starts, so a database outage is still a 503.
    first = found.page(after=after, limit=STREAM_BATCH)

    def stream() -> Iterator[str]:
        yield '{"labels":['
        batch, separator = first, ""
        while batch:
            yield separator + ",".join(
                json.dumps({"name": name, "state": label_state}, ensure_ascii=False)
                for name, label_state in batch
            )
            separator = ","
            if len(batch) < STREAM_BATCH:
                break
            batch = found.page(after=batch[-1][0], limit=STREAM_BATCH)
        yield '],"create":' + json.dumps(labels + "/:name") + "}"

    return flask.Response(stream(), mimetype="application/json")


@blueprint.route("/state-machines/<name:sm>/labels/", methods=["GET", "POST", "PATCH", "DELETE"])
@endpoint(READ, "An empty label name: always refused", {400: Reply("Error")}, tags=("labels",))
def empty_label(sm: str) -> flask.Response:
    machine_or_404(routemaster_app(), sm)
    raise BadRequest("Label names must not be empty.")


@blueprint.post(LABEL)
@endpoint(
    WRITE,
    "Create a label in the machine's first state",
    {
        201: Reply("Label"),
        400: Reply("Error"),
        404: Reply("Error"),
        409: Reply("Error", description="The label exists (or existed and was deleted)"),
        413: Reply("Error", description="The body is over the size limit"),
    },
    body="MetadataBody",
    tags=("labels",),
)
def create_label(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    metadata = metadata_from_body()
    return json_response(label_body(service.create_label(app, machine, label, metadata)), 201)


@blueprint.get(LABEL)
@endpoint(
    READ,
    "A label's metadata and state",
    {200: Reply("Label"), 404: Reply("Error"), 410: Reply("Error")},
    tags=("labels",),
)
def get_label(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    return json_response(label_body(live_label(app, machine_or_404(app, sm), label)))


@blueprint.patch(LABEL)
@endpoint(
    WRITE,
    "Deep-merge metadata into a label's (its triggers may move it)",
    {
        200: Reply("Label"),
        400: Reply("Error"),
        404: Reply("Error"),
        410: Reply("Error"),
        413: Reply("Error", description="The body is over the size limit"),
    },
    body="MetadataBody",
    tags=("labels",),
)
def update_label(sm: str, label: str) -> flask.Response:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    patch = metadata_from_body()
    return json_response(label_body(service.update_metadata(app, machine, label, patch)))


@blueprint.delete(LABEL)
@endpoint(
    WRITE,
    "Delete a label (soft: its name stays taken)",
    {204: Reply(None), 404: Reply("Error", description="No such state machine")},
    tags=("labels",),
)
def delete_label(sm: str, label: str) -> flask.Response:
    """Soft delete; 204 also when there was no such label, so retries are harmless."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    service.delete_label(app, machine, label)
    return flask.Response(status=204)


@blueprint.get(LABEL + "/history")
@endpoint(
    READ,
    "Every transition of a label, oldest first",
    {200: Reply("History"), 404: Reply("Error")},
    tags=("labels",),
)
def label_history(sm: str, label: str) -> flask.Response:
    """Every transition, oldest first; a deleted label keeps its history, deletion last."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    service.get_label(app, machine, label)  # 404 for a name never created
    entries = service.history(app, machine, label)
    return json_response(
        {
            "history": [
                {
                    "kind": entry.kind,
                    "old_state": entry.old_state,
                    "new_state": entry.new_state,
                    "created": isoformat(entry.created),
                    "forced": entry.forced,
                    "reason": entry.reason,
                    "version": entry.version,
                }
                for entry in entries
            ]
        }
    )


def live_label(app: App, machine: StateMachine, label: str) -> service.Label:
    """The label, or 404 (unknown label) / 410 (deleted)."""
    found = service.get_label(app, machine, label)
    if found.deleted:
        raise service.LabelDeleted(label)
    return found


def label_body(label: service.Label) -> dict[str, Any]:
    """The reference's ``metadata`` and ``state``, plus what an operator needs at a glance.

    ``version``: the machine version the label follows (its own on a ``continue`` machine);
    ``parent``: the label whose spawn state created it, for a child.
    """
    app = routemaster_app()
    body = {
        "metadata": label.metadata,
        "state": label.state,
        "state_entered_at": isoformat(label.state_entered_at),
        "paused": label.paused,
        "errored": label.errored,
        "last_error": label.last_error,
        "version": version_of_label(app.config, app.versions, label.state_machine, label.version),
    }
    parent = parent_of(app, label.key)  # a child of a spawn state (SPEC G3)
    if parent is not None:
        body["parent"] = parent
    return body


def metadata_from_body() -> dict[str, Any]:
    """The object in a ``{"metadata": {...}}`` body, or 400 / 413 saying what is wrong.

    The depth limit applies to the metadata itself: the wrapping object is
    not counted, so metadata may nest exactly ``max_json_depth`` levels.
    """
    metadata: dict[str, Any] = checked_body(wrapper_levels=1)["metadata"]
    return metadata
