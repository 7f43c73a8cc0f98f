"""``routemaster serve``: the HTTP API under gunicorn, and one worker beside it (as 1.x ran them).

``serve`` starts ``serve --no-worker`` (the API) and ``cron`` (the worker) as
child processes and watches them (:mod:`routemaster.server.supervisor`);
``serve --no-worker`` runs gunicorn in this process. Both children share
one metrics directory made here, so the API's ``/metrics`` shows the
worker's values too.
"""

from __future__ import annotations

import sys

import click

from routemaster.app import App, Settings
from routemaster.cli.configuration import (
    checked_by_parent,
    continuing,
    prepare_database,
    prepared_database,
)
from routemaster.cli.environment import (
    database_url,
    late_config_option,
    settings_from_environment,
    use_json_logs,
)
from routemaster.cli.metrics import instrumented, multiprocess_directory, wants_metrics_directory
from routemaster.cli.options import Options, direct_engine
from routemaster.db.history import stamp_versions
from routemaster.db.nodes import route_reads, route_writes
from routemaster.db.plumbing.database import create_engine
from routemaster.logging import wants_json
from routemaster.machine.definitions import LoadedVersions
from routemaster.server.application import WSGIApp, default_threads, run_server
from routemaster.server.supervisor import Child, supervise


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
    help="Gunicorn worker processes (default $WEB_CONCURRENCY, else 1 per CPU, 2 to 8).",
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
@click.option(
    "--no-worker",
    "no_worker",
    is_flag=True,
    help="Run the API only, for deployments that run their workers with `cron` "
    "(by default serve also runs one worker, whatever --workers says).",
)
@click.option("--metrics-dir", "given_metrics_dir", default=None, hidden=True)
# serve's API: the versions serve checked and recorded (cli.configuration.checked_by_parent).
@click.option("--checked", default=None, hidden=True)
@late_config_option
@click.pass_obj
def serve(
    options: Options,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
    no_worker: bool,
    given_metrics_dir: str | None,
    checked: str | None,
) -> None:
    """Run the HTTP API under gunicorn, and one worker (unless --no-worker)."""
    settings = settings_from_environment()
    if not no_worker:
        _serve_with_worker(options, settings, bind, workers, threads, keep_alive)
        return
    # Before anything (a logging plugin, say) imports prometheus_client.
    wanted = wants_metrics_directory(settings.metrics)
    with multiprocess_directory(wanted, given=given_metrics_dir) as metrics_dir:
        _serve(options, settings, metrics_dir, checked, bind, workers, threads, keep_alive)


def _serve_with_worker(
    options: Options,
    settings: Settings,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
) -> None:
    """The API and one worker as child processes, until a signal (or until one ends)."""
    config = options.load()  # a config error is told once, before any process starts
    if any(  # this process builds no plugin: its own lines as JSON when the children's are
        plugin.dotted_path == "routemaster.logging:PythonLogger" and dict(plugin.kwargs).get("json")
        for plugin in config.logging_plugins
    ):
        use_json_logs()
    # Once, here: the children trust it (the same message, exit 1, before any process starts).
    checked = checked_by_parent(prepare_database(database_url(), config), config)
    command = [sys.executable, "-m", "routemaster"]
    command += [f"--config={path}" for path in options.config_paths]
    api = [*command, "serve", "--no-worker", "--checked", checked]
    for option, value in (
        ("--bind", bind),
        ("--workers", workers),
        ("--threads", threads),
        ("--keep-alive", keep_alive),
    ):
        if value is not None:
            api += [option, str(value)]
    worker = [*command, "cron", "--checked", checked]
    with multiprocess_directory(wants_metrics_directory(settings.metrics)) as metrics_dir:
        if metrics_dir is not None:
            api += ["--metrics-dir", metrics_dir]
            worker += ["--metrics-dir", metrics_dir]
        code = supervise([Child("API", api, takes_api_signals=True), Child("worker", worker)])
    sys.exit(code)


def _serve(
    options: Options,
    settings: Settings,
    metrics_dir: str | None,
    checked: str | None,
    bind: str | None,
    workers: int | None,
    threads: int | None,
    keep_alive: int | None,
) -> None:
    config = options.load()
    loggers = options.loggers(config)
    url = database_url()
    versions = prepared_database(url, config, checked)

    worker_threads = threads or default_threads()

    def build() -> WSGIApp:
        from routemaster.web import create_app

        # One connection per thread that can be serving a request, one for the streams.
        engine = create_engine(
            url,
            pool_size=worker_threads + 1,
            max_overflow=4,
            statement_timeout=settings.statement_timeout,
        )
        stamp_versions(engine, versions, continuing(config))
        route_reads(engine, on=settings.route_reads)
        route_writes(engine, on=settings.route_writes)
        app = App(
            config=config,
            db=engine,
            settings=settings,
            loggers=loggers,
            versions=LoadedVersions(in_force=versions),
            direct=direct_engine(),
        )
        if metrics_dir is not None and settings.metrics:
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
