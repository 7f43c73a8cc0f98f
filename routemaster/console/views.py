"""The console's pages and buttons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import flask
from werkzeug.exceptions import BadRequest, Forbidden, HTTPException, NotFound
from werkzeug.wrappers import Response

from routemaster import service
from routemaster.app import App
from routemaster.config import describe_machine
from routemaster.config.model import Action, StateMachine
from routemaster.console import access
from routemaster.console.graph_layout import layout, trigger_text
from routemaster.machine.definitions import version_of_label
from routemaster.service import reads, receivers
from routemaster.service.bulk import COMMANDS as BULK_COMMANDS
from routemaster.service.explanations import explanation_of
from routemaster.service.refusals import Malformed, Missing
from routemaster.service.scheduling import next_moves
from routemaster.service.search import listing_search, page_of_matches
from routemaster.service.snapshots import (
    Snapshot,
    label_and_history,
    machine_overview,
    machines_counted,
)
from routemaster.service.tasks import tasks_in_flight
from routemaster.webcore.endpoints import EVENT_STREAM, HTML, OPEN, Reply, endpoint
from routemaster.webcore.extension import machine_or_404, routemaster_app
from routemaster.webcore.paging import next_link, page_of
from routemaster.webcore.paths import link
from routemaster.webcore.responses import explanation_json, past_tasks, receivers_json
from routemaster.webcore.streams import AFTER, stream_response

blueprint = flask.Blueprint("console", __name__, url_prefix="/console", template_folder="templates")

STATIC = Path(__file__).with_name("static")

# The console signs people in itself (a cookie, see access.py): for the API's
# bearer check its routes are open. Its answers are pages, errors included.
_PAGE = Reply(None, HTML)
PAGES = {status: _PAGE for status in (200, 400, 403, 404)} | {
    302: Reply(None, HTML, "Sign in first (with tokens on)")
}
BUTTON = {status: _PAGE for status in (303, 302, 400, 403, 404)}

PAGE = 100
COMMANDS = ("retry", "pause", "resume", "move")
NO_SIGN_IN = ("console.stylesheet", "console.script", "console.login")


@blueprint.before_request
def require_access() -> Response | None:
    if flask.request.endpoint in NO_SIGN_IN:
        return None
    found = access.current_access()
    if found is None:
        return flask.redirect(flask.url_for("console.login", next=flask.request.full_path))
    if not found.may("read"):
        raise Forbidden("This token may not read.")
    flask.g.access = found
    return None


@blueprint.after_request
def protect(response: Response) -> Response:
    access.remember_csrf_token(response)
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    )
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


@blueprint.errorhandler(HTTPException)
def error_page(error: HTTPException) -> tuple[str, int]:
    """The error as a page, with the navigation every page has.

    An address that matches no page never ran :func:`require_access`, so what
    the request may do (which links the navigation shows) is read here.
    """
    seen = flask.g.get("access") or access.current_access()
    page = flask.render_template("console/error.html", error=error, access=seen)
    return page, error.code or 500


@blueprint.errorhandler(Missing)
def missing_page(error: Missing) -> tuple[str, int]:
    return error_page(NotFound(str(error)))


@blueprint.errorhandler(Malformed)
def malformed_page(error: Malformed) -> tuple[str, int]:
    return error_page(BadRequest(str(error)))


@blueprint.app_template_global()
def label_url(machine: str, name: str, *parts: str) -> str:
    return "/console" + link("machines", machine, "labels", name, *parts)


@blueprint.app_template_global()
def machine_url(machine: str, *parts: str) -> str:
    return "/console" + link("machines", machine, *parts)


@blueprint.app_template_filter("trigger")
def trigger_filter(trigger: dict[str, Any]) -> str:
    return trigger_text(trigger)


@blueprint.app_template_global()
def csrf_token() -> str:
    return access.csrf_token()


@blueprint.get("/static/console.css")
@endpoint(OPEN, "The console's stylesheet", {200: Reply(None, "text/css")}, tags=("console",))
def stylesheet() -> Response:
    return flask.send_from_directory(STATIC, "console.css", max_age=300)


@blueprint.get("/static/console.js")
@endpoint(OPEN, "The console's script", {200: Reply(None, "text/javascript")}, tags=("console",))
def script() -> Response:
    return flask.send_from_directory(STATIC, "console.js", max_age=300)


STREAM = {200: Reply(None, EVENT_STREAM), 302: PAGES[302], 400: _PAGE, 404: _PAGE}


@blueprint.get("/changes")
@endpoint(OPEN, "Every change, for the console's pages", STREAM, query=AFTER, tags=("console",))
def changes() -> Response:
    """The changes stream for the console's script: signed in by cookie, not by header.

    ``EventSource`` cannot send an ``Authorization`` header, so with tokens
    on the console's pages follow these instead of ``/changes``.
    """
    return stream_response(None)


@blueprint.get("/machines/<name:sm>/changes")
@endpoint(
    OPEN,
    "A machine's changes, for the console's pages",
    STREAM,
    query=AFTER,
    tags=("console",),
)
def machine_changes(sm: str) -> Response:
    return stream_response(machine_or_404(routemaster_app(), sm).name)


@blueprint.get("/")
@endpoint(OPEN, "The console: machines with counts per state", PAGES, tags=("console",))
def index() -> str:
    seen, machines = machines_counted(routemaster_app())
    return render_page(
        "index.html",
        machines=machines,
        changes_url="/console/changes",
        snapshot=seen,
        machine=None,
    )


@blueprint.get("/machines/<name:sm>")
@endpoint(OPEN, "The console: a machine's graph and labels", PAGES, tags=("console",))
def machine_page(sm: str) -> str:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    overview = machine_overview(app, machine, recent=30, errored=21)
    counts, errored = overview.counts, overview.errored
    held = tasks_in_flight(app)
    described = describe_machine(machine)
    return render_page(
        "machine.html",
        machine=machine,
        graph=layout(described),
        counts=counts,
        stranded=sorted(set(counts) - {state.name for state in machine.states}),
        recent=overview.recent,
        errored=errored[:20],
        more_errored=len(errored) > 20,
        tasks=[
            (state, held.get((machine.name, state.name), 0))
            for state in machine.states
            if isinstance(state, Action) and (state.pulled or state.async_timeout)
        ],
        next_moves=next_moves(app, machine, limit=5),
        changes_url=machine_url(machine.name, "changes"),
        snapshot=overview.snapshot,
        versions_in_use=overview.versions_in_use,
    )


@blueprint.get("/machines/<name:sm>/labels")
@endpoint(OPEN, "The console: a search for labels", PAGES, tags=("console",))
def labels_page(sm: str) -> str | tuple[str, int]:
    """Labels by name prefix, state and errored, and by an expression (``where``)."""
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    args = flask.request.args
    prefix, after = args.get("prefix", ""), args.get("after", "")
    state = args.get("state") or None
    errored = args.get("errored") == "true"
    where = args.get("where") or None
    for value in (prefix, after, state or ""):
        if "\x00" in value or len(value) > 1024:
            raise BadRequest("Search terms must be under 1,024 characters, without NUL.")
    shown = {"machine": machine, "prefix": prefix, "state": state, "errored": errored}
    try:
        search = listing_search(app, machine, where, state=state, errored=errored, prefix=prefix)
    except Malformed as error:
        page = render_page("labels.html", **shown, where=where, rows=[], where_error=str(error))
        return page, 400
    found = page_of(lambda size: page_of_matches(app, search, after=after, limit=size), PAGE)
    following = None
    if found.last is not None:
        query = {"prefix": prefix, "state": state or "", "after": found.last[0]}
        if errored:
            query["errored"] = "true"
        if where is not None:
            query["where"] = where
        following = next_link(machine_url(machine.name, "labels"), query)
    return render_page(
        "labels.html",
        **shown,
        where=where,
        rows=found.rows,
        following=following,
        commands=BULK_COMMANDS,
    )


@blueprint.get("/machines/<name:sm>/labels/<name:label>")
@endpoint(OPEN, "The console: a label and why it waits", PAGES, tags=("console",))
def label_page_view(sm: str, label: str) -> str:
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    seen, found, history = label_and_history(app, machine, label)
    if found is None:
        raise NotFound(f"No label {label!r} in {machine.name}.")
    explanation = None if found.deleted else explanation_json(explanation_of(app, machine, found))
    tasks = [] if found.deleted else past_tasks(app, found, limit=20)
    return render_page(
        "label.html",
        machine=machine,
        label=found,
        metadata=json.dumps(found.metadata, indent=2, ensure_ascii=False, sort_keys=True),
        history=history,
        version=version_of_label(app.config, app.versions, machine.name, found.version),
        tasks=tasks,
        explanation=explanation,
        changes_url=machine_url(machine.name, "changes"),
        snapshot=seen,
        deliveries_url=link("state-machines", machine.name, "labels", label, "deliveries"),
        children_url=link("state-machines", machine.name, "labels", label, "children"),
    )


@blueprint.post("/machines/<name:sm>/labels/<name:label>/<command>")
@endpoint(OPEN, "The console: an operator's button", BUTTON, tags=("console",))
def operate(sm: str, label: str, command: str) -> Response:
    """An operator's button: the command, then back to the page it came from."""
    access.check_csrf()
    if not flask.g.access.may("operate"):
        raise Forbidden("This token may not operate labels.")
    if command not in COMMANDS:
        raise NotFound(f"No console command {command!r}.")
    app = routemaster_app()
    machine = machine_or_404(app, sm)
    reason = flask.request.form.get("reason") or None
    back = _back_to(flask.request.form.get("next"), label_url(machine.name, label))
    try:
        _run(app, machine, label, command, reason)
    except service.InvalidOperation as error:
        return flask.redirect(_with(back, "problem", str(error)), 303)
    except (service.LabelNotFound, service.LabelDeleted):
        return flask.redirect(_with(back, "problem", f"{label!r} cannot be changed."), 303)
    done = {"retry": "retried", "pause": "paused", "resume": "resumed", "move": "moved"}
    return flask.redirect(_with(back, "notice", f"{label!r} {done[command]}."), 303)


@blueprint.get("/receivers")
@endpoint(
    OPEN,
    "The console: receivers, their circuits, recent failures, and how this server hears of work",
    PAGES,
    tags=("console",),
)
def receivers_page() -> str:
    app = routemaster_app()
    failures = reads.recent_failures(app, limit=20)
    return render_page(
        "receivers.html",
        receivers=receivers_json(app),
        failures=failures,
        wakeups=None if app.metrics is None else app.metrics.wakeups(),
        poll_interval=app.settings.poll_interval,
        label_reads=reads.label_read_routes(app),
        label_writes=reads.label_write_route(app),
    )


@blueprint.post("/receivers/<name:receiver>/<command>")
@endpoint(OPEN, "The console: pause or resume a receiver", BUTTON, tags=("console",))
def operate_receiver(receiver: str, command: str) -> Response:
    access.check_csrf()
    if not flask.g.access.may("operate"):
        raise Forbidden("This token may not operate receivers.")
    if command not in ("pause", "resume"):
        raise NotFound(f"No console command {command!r}.")
    try:
        receivers.set_receiver_paused(routemaster_app(), receiver, paused=command == "pause")
    except Missing:
        return flask.redirect(
            _with("/console/receivers", "problem", f"No receiver {receiver!r}."), 303
        )
    return flask.redirect(_with("/console/receivers", "notice", f"{receiver} {command}d."), 303)


@blueprint.route("/login", methods=["GET", "POST"])
@endpoint(
    OPEN, "The console: sign in with a token", {**BUTTON, 200: _PAGE, 401: _PAGE}, tags=("console",)
)
def login() -> Response | str | tuple[str, int]:
    check = access.token_check()
    target = _back_to(flask.request.values.get("next"), "/console/")
    if flask.request.method == "GET" or check is None:
        return render_page("login.html", enabled=check is not None, target=target, failed=False)
    access.check_csrf()
    secret = flask.request.form.get("token", "").strip()
    scopes = check(secret) if secret else None
    if scopes is None or "read" not in scopes:
        return render_page("login.html", enabled=True, target=target, failed=True), 401
    response = flask.redirect(target, 303)
    access.sign_in(response, secret)
    return response


@blueprint.post("/logout")
@endpoint(OPEN, "The console: sign out", BUTTON, tags=("console",))
def logout() -> Response:
    access.check_csrf()
    response = flask.redirect(flask.url_for("console.login"), 303)
    access.sign_out(response)
    return response


def _run(app: App, machine: StateMachine, label: str, command: str, reason: str | None) -> None:
    if command == "retry":
        service.retry_label(app, machine, label, reason=reason)
    elif command in ("pause", "resume"):
        service.set_label_paused(app, machine, label, command == "pause", reason=reason)
    else:
        destination = flask.request.form.get("state", "")
        service.force_move(app, machine, label, destination, reason=reason)


def render_page(template: str, **context: Any) -> str:
    """A console page: ``template`` with what every page shows (access, notices, snapshot)."""
    seen: Snapshot | None = context.pop("snapshot", None)
    return flask.render_template(
        f"console/{template}",
        access=flask.g.get("access"),
        notice=flask.request.args.get("notice"),
        problem=flask.request.args.get("problem"),
        after=None if seen is None else str(seen.position),
        seen=None if seen is None else str(seen),
        **context,
    )


def _back_to(target: str | None, default: str) -> str:
    """Only a path inside the console: never a redirect to another site."""
    if target and target.startswith("/console/") and "\\" not in target:
        return target
    return default


def _with(url: str, key: str, message: str) -> str:
    path = url.split("?", 1)[0]
    return f"{path}?{urlencode({key: message}, quote_via=quote)}"
