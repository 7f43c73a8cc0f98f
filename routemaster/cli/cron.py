"""``routemaster cron``: the worker."""

from __future__ import annotations

import click

from routemaster.app import App
from routemaster.cli.configuration import prepare_database
from routemaster.cli.environment import database_url, late_config_option, settings_from_environment
from routemaster.cli.metrics import worker_metrics
from routemaster.cli.options import Options
from routemaster.db.database import create_engine
from routemaster.db.versions import stamp_connections


@click.command()
@click.option(
    "--metrics-bind",
    default=None,
    metavar="HOST:PORT",
    help="Serve the worker's Prometheus metrics at http://HOST:PORT/metrics.",
)
@late_config_option
@click.pass_obj
def cron(options: Options, metrics_bind: str | None) -> None:
    """Run the worker: gate triggers, action webhooks, retries. Run as many as you like."""
    from routemaster.worker import run_worker

    config = options.load()
    plugins = options.loggers(config)
    settings = settings_from_environment()
    url = database_url()
    versions = prepare_database(url, config)
    engine = create_engine(
        url,
        pool_size=5,
        max_overflow=settings.delivery_concurrency + 5,
        statement_timeout=settings.statement_timeout,
    )
    stamp_connections(engine, versions)
    try:
        with worker_metrics(metrics_bind, plugins) as (metrics, loggers):
            app = App(config=config, db=engine, settings=settings, loggers=loggers)
            app.metrics = metrics
            run_worker(app)
    finally:
        engine.dispose()
