"""``GET /metrics`` (Prometheus text), and timing every request by its endpoint template.

Requests are counted by the route that matched (``/state-machines/{sm}/labels/{label}``),
never by the raw path, so label names do not become series; a path that
matches no route counts as ``unmatched``.
"""

from __future__ import annotations

import time

import flask
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from routemaster.api.openapi import openapi_path
from routemaster.app import App
from routemaster.metrics import Metrics
from routemaster.metrics.flow_gauges import FlowGauges
from routemaster.metrics.label_gauges import LabelGauges
from routemaster.metrics.receiver_gauges import ReceiverGauges
from routemaster.metrics.retention_progress import RetentionGauges
from routemaster.metrics.subscription_gauges import SubscriptionGauges
from routemaster.webcore.endpoints import OPEN, TEXT, Reply, endpoint
from routemaster.webcore.extension import STARTED

blueprint = flask.Blueprint("metrics", __name__)

EXPOSITION_KEY = "routemaster.metrics"
UNMATCHED = "unmatched"


@blueprint.get("/metrics")
@endpoint(OPEN, "Prometheus metrics", {200: Reply(None, TEXT, "Prometheus text format")})
def metrics() -> flask.Response:
    """Open like ``GET /``: scrapers carry no token; nothing here names a label."""
    registry = flask.current_app.extensions[EXPOSITION_KEY]
    return flask.Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def instrument(flask_app: flask.Flask, app: App, metrics: Metrics) -> None:
    """Time every request, and expose the metrics with the label gauges at ``/metrics``."""
    gauges = LabelGauges(
        app.db,
        app.config,
        interval=app.settings.label_gauges_interval,
        directory=metrics.multiprocess_dir,
        in_force=app.versions.in_force,
    )
    receiver_gauges = ReceiverGauges(
        app.db, app.config, interval=app.settings.label_gauges_interval
    )
    lags = SubscriptionGauges(app.db, app.horizon, interval=app.settings.label_gauges_interval)
    retention = RetentionGauges(app.db, interval=app.settings.label_gauges_interval)
    flow_gauges = FlowGauges(app.db, app.config, interval=app.settings.label_gauges_interval)
    flask_app.extensions[EXPOSITION_KEY] = metrics.registry(
        gauges, receiver_gauges, lags, retention, flow_gauges
    )
    templates: dict[str, str] = {}

    def finish(response: flask.Response) -> flask.Response:
        request = flask.request._get_current_object()  # type: ignore[attr-defined]
        started = request.environ.get(STARTED)
        if started is None:
            return response
        rule = request.url_rule
        if rule is None:
            template = UNMATCHED
        else:
            template = templates.get(rule.rule) or templates.setdefault(
                rule.rule, openapi_path(rule.rule)
            )
        metrics.observe_request(
            request.method, template, response.status_code, time.perf_counter() - started
        )
        return response

    # Flask runs after-request functions on every response it makes, error answers included.
    flask_app.after_request(finish)
