"""Every error is a JSON body ``{"message": ...}`` with the right status: never an HTML page."""

from __future__ import annotations

import logging

import flask
import sqlalchemy as sa
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.wrappers import Response

from routemaster.api.extension import routemaster_app
from routemaster.api.responses import json_response
from routemaster.labels import LabelDeleted, LabelExists, LabelNotFound

logger = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "Cannot connect to database"


def register_error_handlers(flask_app: flask.Flask) -> None:
    flask_app.register_error_handler(HTTPException, _http_error)
    flask_app.register_error_handler(LabelExists, _label_exists)
    flask_app.register_error_handler(LabelNotFound, _label_not_found)
    flask_app.register_error_handler(LabelDeleted, _label_deleted)
    flask_app.register_error_handler(sa.exc.DataError, _data_refused)
    flask_app.register_error_handler(sa.exc.OperationalError, _database_unavailable)
    flask_app.register_error_handler(sa.exc.TimeoutError, _database_unavailable)
    # Not a handler for Exception: Flask then sends got_request_exception (Sentry listens)
    # and answers with the InternalServerError handler below.
    flask_app.register_error_handler(InternalServerError, _internal_error)


def _http_error(error: HTTPException) -> Response:
    if error.code is None or error.code < 400:  # routing redirects keep Werkzeug's response
        return error.get_response()
    headers = {key: value for key, value in error.get_headers() if key.lower() != "content-type"}
    return json_response({"message": error.description}, error.code, headers)


def _label_exists(error: LabelExists) -> flask.Response:
    return json_response({"message": f"Label {str(error)!r} already exists."}, 409)


def _label_not_found(error: LabelNotFound) -> flask.Response:
    return json_response({"message": f"Label {str(error)!r} does not exist."}, 404)


def _label_deleted(error: LabelDeleted) -> flask.Response:
    return json_response({"message": f"Label {str(error)!r} has been deleted."}, 410)


def _data_refused(error: sa.exc.DataError) -> flask.Response:
    """Values PostgreSQL cannot store (e.g. ``\\u0000`` in JSON) are the client's error."""
    diag = getattr(error.orig, "diag", None)
    detail = getattr(diag, "message_primary", None) or "invalid value"
    return json_response({"message": f"The database refused a value: {detail}."}, 400)


def _database_unavailable(error: Exception) -> flask.Response:
    logger.warning("database unavailable: %s", error)
    return json_response({"message": DATABASE_UNAVAILABLE}, 503)


def _internal_error(error: InternalServerError) -> flask.Response:
    """An unexpected error (Flask has logged it): told to the plugins while it is handled."""
    if error.original_exception is not None:
        where = f"{flask.request.method} {flask.request.path}"
        routemaster_app().hooks.exception(f"Unhandled error in {where}")
    return json_response({"message": "Internal server error."}, 500)
