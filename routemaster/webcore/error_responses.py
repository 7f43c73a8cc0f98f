"""Every error is a JSON body ``{"message": ...}`` with the right status: never an HTML page."""

from __future__ import annotations

import logging

import flask
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.wrappers import Response

from routemaster.service import LabelDeleted, LabelExists, LabelNotFound
from routemaster.service.database import DatabaseFailure, Kind, StoreError, describe_failure
from routemaster.service.refusals import Malformed, Missing
from routemaster.webcore.extension import routemaster_app
from routemaster.webcore.responses import json_response

logger = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "Cannot connect to database"


def register_error_handlers(flask_app: flask.Flask) -> None:
    flask_app.register_error_handler(HTTPException, http_error)
    flask_app.register_error_handler(LabelExists, _label_exists)
    flask_app.register_error_handler(LabelNotFound, _label_not_found)
    flask_app.register_error_handler(LabelDeleted, _label_deleted)
    flask_app.register_error_handler(Missing, _missing)
    flask_app.register_error_handler(Malformed, _malformed)
    flask_app.register_error_handler(StoreError, _database_error)
    # Not a handler for Exception: Flask then sends got_request_exception (Sentry listens)
    # and answers with the InternalServerError handler below.
    flask_app.register_error_handler(InternalServerError, _internal_error)


def http_error(error: HTTPException) -> Response:
    """Werkzeug's error as the JSON error body, with its status and headers."""
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


def _missing(error: Missing) -> flask.Response:
    return json_response({"message": str(error)}, 404)


def _malformed(error: Malformed) -> flask.Response:
    return json_response({"message": str(error)}, 400)


def _database_error(error: StoreError) -> flask.Response:
    """A JSON answer saying what the database did, with no SQL, parameters or address.

    503 "Cannot connect to database" means exactly that the server could not
    be reached; every other failure gets its own status and message. One
    log line per failure, without the statement.
    """
    failure = describe_failure(error)
    status, message = _answer(failure)
    if status >= 500:
        logger.warning("%s %s: %s", flask.request.method, flask.request.path, failure.log_line())
    else:
        logger.info("%s %s: %s", flask.request.method, flask.request.path, failure.log_line())
    # A shard that moved under the request is where it is now: asking again at once works.
    headers = {"Retry-After": "1"} if failure.kind is Kind.MOVED else None
    return json_response({"message": message}, status, headers)


def _answer(failure: DatabaseFailure) -> tuple[int, str]:
    if failure.kind is Kind.UNREACHABLE:
        return 503, DATABASE_UNAVAILABLE
    if failure.kind is Kind.BUSY:
        return 503, "The database is busy: no connection became free in time. Try again."
    if failure.kind is Kind.TIMEOUT:
        limit = routemaster_app().settings.statement_timeout
        return 504, (
            f"The database did not finish within the statement timeout ({limit:g} s) "
            "and the statement was cancelled; nothing was changed."
        )
    if failure.kind is Kind.REFUSED:
        return 400, f"The database refused a value: {failure.detail}."
    if failure.kind is Kind.TOO_LARGE:
        return 413, f"The request exceeds a database limit: {failure.detail}."
    if failure.kind is Kind.MOVED:
        return 503, (
            "Part of the database moved to another node while this request ran (a shard "
            "move); nothing was changed. Try again."
        )
    if failure.kind is Kind.CONFLICT:
        return 409, "A concurrent change conflicted with this request; nothing was changed. Retry."
    return 500, f"Database error ({failure.sqlstate or failure.detail}); nothing was changed."


def _internal_error(error: InternalServerError) -> flask.Response:
    """An unexpected error (Flask has logged it): told to the plugins while it is handled."""
    if error.original_exception is not None:
        where = f"{flask.request.method} {flask.request.path}"
        routemaster_app().hooks.exception(f"Unhandled error in {where}")
    return json_response({"message": "Internal server error."}, 500)
