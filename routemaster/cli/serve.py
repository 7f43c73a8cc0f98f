"""``routemaster serve``: the HTTP API under gunicorn."""

from __future__ import annotations

import click

from routemaster.app import App, Settings
from routemaster.cli.configuration import prepare_database
from routemaster.cli.environment import database_url, late_config_option, settings_from_environment
from routemaster.cli.metrics import instrumented, multiprocess_directory
from routemaster.cli.options import Options
from routemaster.db.database import create_engine
from routemaster.db.versions import stamp_connections
from routemaster.logging import wants_json
from routemaster.server.application import WSGIApp, default_threads, run_server


@click.command()
@click.option(
    "-b",
    "--bind",
    default=None,
    metavar="HOST:PORT",
    help="Address to listen on (default [::]:2017).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Gunicorn worker processes (default $WEB_CONCURRENCY, else 2 x CPUs, <= 8).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Threads per worker (default $WEB_THREADS, else 1).",
)
@click.option(
    "--keep-alive",
    "keep_alive",
    type=click.IntRange(min=0),
    default=None,
    metavar="SECONDS",
    help="How long a client's idle connection is kept open for its next request "
    "(default $WEB_KEEPALIVE, else 2); 0: one request per connection, on gunicorn's "
    "sync worker when there is one thread.",
)
@late_config_option
@click.pass_obj
def serve(
    options: Options,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
) -> None:
    """Run the HTTP API under gunicorn."""
    settings = settings_from_environment()
    # Before anything (a logging plugin, say) imports prometheus_client.
    with multiprocess_directory(settings.metrics) as metrics_dir:
        _serve(options, settings, metrics_dir, bind, workers, threads, keep_alive)


def _serve(
    options: Options,
    settings: Settings,
    metrics_dir: str | None,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
) -> None:
    config = options.load()
    loggers = options.loggers(config)
    url = database_url()
    versions = prepare_database(url, config)

    worker_threads = threads or default_threads()

    def build() -> WSGIApp:
        from routemaster.api import create_app

        # One connection per thread that can be serving a request, one for the streams.
        engine = create_engine(
            url,
            pool_size=worker_threads + 1,
            max_overflow=4,
            statement_timeout=settings.statement_timeout,
        )
        stamp_connections(engine, versions)
        app = App(config=config, db=engine, settings=settings, loggers=loggers)
        if metrics_dir is not None:
            app.metrics, app.loggers = instrumented(loggers, metrics_dir)
        return create_app(app)

    run_server(
        build,
        bind=bind,
        workers=workers,
        threads=threads,
        keep_alive=keep_alive,
        json_logs=wants_json(loggers),
    )
