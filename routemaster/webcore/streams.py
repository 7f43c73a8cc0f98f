"""The changes stream as an HTTP response: what ``/changes`` and the console's pages answer.

Each event is one history entry (:mod:`routemaster.hubs.changes` writes them);
a client resumes with the ``Last-Event-ID`` header or ``?after=POSITION``.
Both web faces serve streams, so both take them from here.
"""

from __future__ import annotations

import flask
from werkzeug.exceptions import BadRequest, ServiceUnavailable

from routemaster.hubs.changes import STREAM_KEY, ChangeHub, TooManyStreams
from routemaster.service.snapshots import Position, present
from routemaster.webcore.endpoints import EVENT_STREAM, Query, Reply
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.request_checks import checked_query
from routemaster.webcore.schemas import POSITION_PATTERN

HUB_KEY = "routemaster.hubs.changes"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def change_hub(flask_app: flask.Flask) -> ChangeHub:
    hub = flask_app.extensions[HUB_KEY]
    assert isinstance(hub, ChangeHub)
    return hub


STREAM_REPLIES = {
    200: Reply(
        None,
        EVENT_STREAM,
        "Server-sent events: `id:` a position, `data:` a change as JSON; "
        '`event: gap` with `data: {"kind": "gap", "oldest": POSITION}` when retention '
        "removed changes after the position resumed from (the stream continues after "
        "`oldest`); `: keep-alive` comments while idle",
    ),
    400: Reply("Error"),
    503: Reply("Error"),
}
AFTER = (
    Query(
        "after",
        {
            "type": "string",
            "pattern": POSITION_PATTERN,
            "x-error": "after takes a position as sent in an event's id: XACT-ID.",
        },
        "Resume after this position (an event's id); the Last-Event-ID header takes precedence.",
    ),
)


def stream_response(machine: str | None) -> flask.Response:
    """The changes of ``machine`` (``None``: all) from the request's position, as a stream."""
    app = routemaster_app()
    after = _resume_from()
    if flask.request.method == "HEAD":  # what a GET would answer, without the endless body
        return flask.Response(mimetype="text/event-stream", headers=STREAM_HEADERS)
    if after is None:
        # Read before the response starts, so a database outage is still a 503.
        after = present(app)
    try:
        stream = change_hub(flask.current_app).subscribe(machine, after)
    except TooManyStreams as error:
        raise ServiceUnavailable(f"Too many open change streams: {error}.") from None
    flask.request.environ[STREAM_KEY] = stream
    return flask.Response(stream.events(), mimetype="text/event-stream", headers=STREAM_HEADERS)


def _resume_from() -> Position | None:
    raw = flask.request.headers.get("Last-Event-ID") or checked_query().get("after")
    if raw is None:
        return None
    try:
        return Position.parse(raw)
    except ValueError:
        raise BadRequest(
            "Last-Event-ID and after= take a position as sent in an event's id: XACT-ID."
        ) from None
