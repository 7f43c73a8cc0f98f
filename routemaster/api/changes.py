"""``GET /changes`` and ``GET /state-machines/{sm}/changes``: history as server-sent events.

Each event is one history entry: ``id:`` its position (``XACT-ID``, see
:mod:`routemaster.service.snapshots`), ``data:`` a JSON object. A client resumes
with the ``Last-Event-ID`` header (EventSource sends it on reconnection) or
``?after=POSITION``; ``?after=0-0`` starts from the first change ever
recorded; with neither, the stream starts at the present. A position older
than what retention kept is answered first by one ``event: gap`` whose data
is ``{"kind": "gap", "oldest": POSITION}``; the stream continues after
``POSITION``.
"""

from __future__ import annotations

import flask

from routemaster.auth import READ
from routemaster.webcore.endpoints import Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.streams import AFTER, STREAM_REPLIES, stream_response

blueprint = flask.Blueprint("changes", __name__)


@blueprint.get("/changes")
@endpoint(READ, "Every change as it happens", STREAM_REPLIES, query=AFTER, tags=("changes",))
def all_changes() -> flask.Response:
    return stream_response(None)


@blueprint.get("/state-machines/<name:sm>/changes")
@endpoint(
    READ,
    "A machine's changes as they happen",
    {**STREAM_REPLIES, 404: Reply("Error")},
    query=AFTER,
    tags=("changes",),
)
def machine_changes(sm: str) -> flask.Response:
    return stream_response(machine_or_404(routemaster_app(), sm).name)
