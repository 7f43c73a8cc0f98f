"""``routemaster cron``: the worker (also the worker that ``serve`` runs beside the API)."""

from __future__ import annotations

import click

from routemaster.app import App
from routemaster.cli.configuration import continuing, prepared_database
from routemaster.cli.environment import database_url, late_config_option, settings_from_environment
from routemaster.cli.metrics import instrumented, multiprocess_directory, worker_metrics
from routemaster.cli.options import Options, direct_engine
from routemaster.cli.plugins import sending_statsd_at_once
from routemaster.db.history import stamp_versions
from routemaster.db.nodes import route_reads, route_writes
from routemaster.db.plumbing.database import create_engine
from routemaster.machine.definitions import LoadedVersions


@click.command()
@click.option(
    "--metrics-bind",
    default=None,
    metavar="HOST:PORT",
    help="Serve the worker's Prometheus metrics at http://HOST:PORT/metrics.",
)
# serve's worker: values written to the API's metrics directory (serve made it, serve removes it).
@click.option("--metrics-dir", "given_metrics_dir", default=None, hidden=True)
# serve's worker: the versions serve checked and recorded (cli.configuration.checked_by_parent).
@click.option("--checked", default=None, hidden=True)
@late_config_option
@click.pass_obj
def cron(
    options: Options, metrics_bind: str | None, given_metrics_dir: str | None, checked: str | None
) -> None:
    """Run the worker: gate triggers, action webhooks, retries. Run as many as you like."""
    from routemaster.worker import run_worker

    if metrics_bind is not None and given_metrics_dir is not None:
        raise click.UsageError("--metrics-bind and --metrics-dir exclude each other")
    config = options.load()
    settings = settings_from_environment()
    with multiprocess_directory(False, given=given_metrics_dir):  # before plugins are loaded
        plugins = options.loggers(config)
        sending_statsd_at_once(plugins)
        url = database_url()
        versions = prepared_database(url, config, checked)
        engine = create_engine(
            url,
            pool_size=5,
            max_overflow=settings.delivery_concurrency + 5,
            statement_timeout=settings.statement_timeout,
        )
        stamp_versions(engine, versions, continuing(config))
        route_reads(engine, on=settings.route_reads)
        route_writes(engine, on=settings.route_writes)
        direct = direct_engine()
        try:
            with worker_metrics(metrics_bind, plugins) as (metrics, loggers):
                if given_metrics_dir is not None and settings.metrics:
                    metrics, loggers = instrumented(plugins, given_metrics_dir)
                app = App(
                    config=config,
                    db=engine,
                    settings=settings,
                    loggers=loggers,
                    versions=LoadedVersions(in_force=versions),
                    direct=direct,
                )
                app.metrics = metrics
                run_worker(app)
        finally:
            engine.dispose()
            if direct is not None:
                direct.dispose()
