"""The ``routemaster`` command: serve the API, run the worker, check a config, manage the database.

Every process builds its own :class:`~routemaster.app.App` here and hands it
to the API or the worker; nothing else in the package reads the environment
or the command line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
import sqlalchemy as sa
from gunicorn.app.base import BaseApplication
from gunicorn.config import Config as GunicornConfig

from routemaster import __version__
from routemaster.app import App, Settings
from routemaster.cli_metrics import instrumented, multiprocess_directory, worker_metrics
from routemaster.cli_runtime import (
    JsonGunicornLogger,
    database_url,
    late_config_option,
    settings_from_environment,
    use_json_logs,
)
from routemaster.cli_tokens import token
from routemaster.config import ConfigError, config_warnings, load_config
from routemaster.config.model import Config
from routemaster.db.database import (
    DatabaseURLError,
    create_engine,
    safe_url,
    url_from_environment,
)
from routemaster.db.embedded import EmbeddedPostgres, EmbeddedUnavailable
from routemaster.db.errors import describe_failure
from routemaster.db.listings import states_in_use
from routemaster.db.migrate import upgrade
from routemaster.logging import BaseLogger, PluginError, load_plugins, wants_json

DEFAULT_PORT = 2017


def named_database_url() -> str | None:
    """``DATABASE_URL`` or ``DB_*`` if set; one clear line (no password) if unusable."""
    try:
        return url_from_environment()
    except DatabaseURLError as error:
        raise click.ClickException(str(error)) from None


def unreachable(url: str, error: BaseException) -> click.ClickException:
    """The one line every command prints when the database cannot be used."""
    detail = describe_failure(error).detail
    return click.ClickException(f"cannot use the database at {safe_url(url)}: {detail}")


def migrate_database(url: str) -> None:
    """Migrate, or exit with one line saying why the database could not be used.

    No statement timeout here: a migration may legitimately take long.
    """
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        upgrade(engine)
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        engine.dispose()


def _load_plugins(config: Config) -> list[BaseLogger]:
    from routemaster.api.plugins import provide_legacy_names

    provide_legacy_names()  # before any 1.x plugin imports them
    return load_plugins(config)


@dataclasses.dataclass(frozen=True)
class _Options:
    config_paths: tuple[str, ...]

    def load(self) -> Config:
        """The layered config, or exit 1 listing every problem."""
        if not self.config_paths:
            raise click.UsageError("give the configuration: routemaster -c CONFIG.yaml COMMAND")
        try:
            return load_config(self.config_paths)
        except ConfigError as error:
            click.echo(str(error), err=True)
            sys.exit(1)

    def loggers(self, config: Config) -> tuple[BaseLogger, ...]:
        """The config's logging plugins, or exit 1 saying which one failed to load."""
        try:
            loggers = tuple(_load_plugins(config))
        except PluginError as error:
            click.echo(str(error), err=True)
            sys.exit(1)
        if wants_json(loggers):
            use_json_logs()
        return loggers


@click.group()
@click.option(
    "-c",
    "--config",
    "--config-file",
    "config_paths",
    multiple=True,
    metavar="CONFIG",
    help="A YAML config file; repeat to layer later files over earlier ones.",
)
@click.version_option(__version__, prog_name="routemaster")
@click.pass_context
def cli(ctx: click.Context, config_paths: tuple[str, ...]) -> None:
    """State machines as a service."""
    ctx.obj = _Options(config_paths)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
    )


def _default_bind() -> str:
    """``[::]:2017``, or ``0.0.0.0:2017`` where the host has no IPv6."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return f"0.0.0.0:{DEFAULT_PORT}"
    return f"[::]:{DEFAULT_PORT}"


def _default_workers() -> int:
    configured = os.environ.get("WEB_CONCURRENCY")
    if configured:
        return int(configured)
    # Measured on 2 cores (docs/performance.md): 2 per core beat 2 per core + 1.
    return min(2 * (os.cpu_count() or 1), 8)


def _default_threads() -> int:
    return int(os.environ.get("WEB_THREADS") or 1)


def _default_keep_alive() -> int:
    # Measured (docs/performance.md): with clients that keep their connections
    # alive, a worker that keeps them (api.serving.JsonErrorsKeepAlive) costs
    # less CPU per request than the sync worker, which closes each after one request.
    return int(os.environ.get("WEB_KEEPALIVE") or 2)


WSGIApp = Callable[..., Any]


class _WorkerConfig(GunicornConfig):  # type: ignore[misc]
    """Gunicorn's settings, each looked up once in a worker instead of on every use.

    A sync worker reads about twenty settings per request through
    ``Config.__getattr__`` (a tenth of its own time per request in the
    profile). Settings cannot change in a forked worker, so after the fork
    (:meth:`freeze`) each value is kept as a plain attribute on first use.
    """

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        if self.__dict__.get("_frozen"):
            object.__setattr__(self, name, value)
        return value

    def freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)


def _freeze_worker_config(server: Any, worker: Any) -> None:
    worker.cfg.freeze()


class _GunicornServer(BaseApplication):  # type: ignore[misc]
    """Gunicorn run in-process; ``build`` runs in each worker after the fork.

    Building there (``preload_app`` off) gives every worker its own database
    pool: a pool's sockets must never be shared across a fork.
    """

    def __init__(self, options: dict[str, Any], build: Callable[[], WSGIApp]) -> None:
        self._options = options
        self._build = build
        super().__init__()

    def load_default_config(self) -> None:
        self.cfg = _WorkerConfig(self.usage, prog=self.prog)

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)
        self.cfg.set("post_fork", _freeze_worker_config)
        # Gunicorn >= 25.1 opens a control socket at one fixed path per user, which
        # several servers on one host would fight over; we do not use it.
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)

    def load(self) -> WSGIApp:
        return self._build()


@cli.command()
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
    options: _Options,
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
    options: _Options,
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
    migrate_database(url)

    worker_threads = threads or _default_threads()
    keep_alive = _default_keep_alive() if keep_alive is None else keep_alive

    def build() -> WSGIApp:
        from routemaster.api import create_app

        # One connection per thread that can be serving a request, one for the streams.
        engine = create_engine(
            url,
            pool_size=worker_threads + 1,
            max_overflow=4,
            statement_timeout=settings.statement_timeout,
        )
        app = App(config=config, db=engine, settings=settings, loggers=loggers)
        if metrics_dir is not None:
            app.metrics, app.loggers = instrumented(loggers, metrics_dir)
        return create_app(app)

    from routemaster.api.serving import REQUEST_LIMITS, worker_class

    server = _GunicornServer(
        {
            "bind": [bind or _default_bind()],
            "workers": workers or _default_workers(),
            "worker_class": worker_class(worker_threads, keep_alive=keep_alive > 0),
            "threads": worker_threads,
            "keepalive": keep_alive,
            "proc_name": "routemaster",
            "errorlog": "-",
            **({"logger_class": JsonGunicornLogger} if wants_json(loggers) else {}),
            "loglevel": "info",
            **REQUEST_LIMITS,
        },
        build,
    )
    server.run()


@cli.command()
@click.option(
    "--metrics-bind",
    default=None,
    metavar="HOST:PORT",
    help="Serve the worker's Prometheus metrics at http://HOST:PORT/metrics.",
)
@late_config_option
@click.pass_obj
def cron(options: _Options, metrics_bind: str | None) -> None:
    """Run the worker: gate triggers, action webhooks, retries. Run as many as you like."""
    from routemaster.worker import run_worker

    config = options.load()
    plugins = options.loggers(config)
    settings = settings_from_environment()
    url = database_url()
    migrate_database(url)
    engine = create_engine(
        url,
        pool_size=5,
        max_overflow=settings.delivery_concurrency + 5,
        statement_timeout=settings.statement_timeout,
    )
    try:
        with worker_metrics(metrics_bind, plugins) as (metrics, loggers):
            app = App(config=config, db=engine, settings=settings, loggers=loggers)
            app.metrics = metrics
            run_worker(app)
    finally:
        engine.dispose()


def stale_states(config: Config, present: Sequence[tuple[str, str]]) -> list[str]:
    """``machine.state`` for each (machine, state) holding labels that the config lacks."""
    known = {
        machine.name: {state.name for state in machine.states} for machine in config.state_machines
    }
    return [
        f"{machine}.{state}"
        for machine, state in sorted(present)
        if state not in known.get(machine, set())
    ]


@cli.command()
@late_config_option
@click.pass_obj
def validate(options: _Options) -> None:
    """Check the config; with DATABASE_URL (or DB_*) set, also that every label's state exists."""
    config = options.load()
    try:
        _load_plugins(config)
    except PluginError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    for warning in config_warnings(config):
        click.echo(f"warning: {warning}", err=True)
    url = named_database_url()
    if url:
        present = _label_states(url)
        if isinstance(present, str):
            click.echo(f"warning: {present}; labels not checked", err=True)
        else:
            stale = stale_states(config, present)
            if stale:
                click.echo(
                    "Labels sit in states the config no longer has: " + ", ".join(stale), err=True
                )
                sys.exit(1)
    click.echo(f"Config valid: {len(config.state_machines)} state machines")


def _label_states(url: str) -> list[tuple[str, str]] | str:
    """The (machine, state) pairs holding labels, or why they could not be read."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 5})
    try:
        return states_in_use(engine)
    except sa.exc.SQLAlchemyError as error:
        return f"database at {safe_url(url)} not usable ({describe_failure(error).detail})"
    finally:
        engine.dispose()


@cli.command()
@late_config_option
def migrate() -> None:
    """Bring the database to the current schema (serve and cron do this at start too)."""
    migrate_database(database_url())
    click.echo("Database schema is current.")


@cli.group()
def db() -> None:
    """The embedded PostgreSQL used when DATABASE_URL is not set."""


def _embedded() -> EmbeddedPostgres:
    try:
        return EmbeddedPostgres.at()
    except EmbeddedUnavailable as error:
        raise click.ClickException(str(error)) from error


@db.command("start")
def db_start() -> None:
    """Start it if needed and print its URL."""
    server = _embedded()
    try:
        started = server.start()
    except EmbeddedUnavailable as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"{'Started' if started else 'Already running'}: {server.data_dir}", err=True)
    click.echo(server.url())


@db.command("stop")
def db_stop() -> None:
    """Stop it (its data is kept)."""
    server = _embedded()
    stopped = server.stop()
    click.echo(f"{'Stopped' if stopped else 'Not running'}: {server.data_dir}", err=True)


@db.command("status")
def db_status() -> None:
    """Exit 0 if it is running, 3 if not."""
    server = _embedded()
    running = server.is_running()
    click.echo(f"{'Running' if running else 'Not running'}: {server.data_dir}")
    sys.exit(0 if running else 3)


cli.add_command(token)


def main() -> None:
    cli(prog_name="routemaster")
