"""``routemaster migrate`` and ``routemaster db``: the schema, and the embedded PostgreSQL."""

from __future__ import annotations

import sys

import click

from routemaster.cli.configuration import compute_next_checks, prepare_database
from routemaster.cli.environment import database_url, late_config_option
from routemaster.cli.options import Options, migrate_database
from routemaster.db.plumbing.embedded import EmbeddedPostgres, EmbeddedUnavailable


@click.command()
@late_config_option
@click.option(
    "--recount",
    is_flag=True,
    help="Count the labels in each state afresh (the counts are kept as labels change; "
    "writes to labels wait while it counts).",
)
@click.pass_obj
def migrate(options: Options, recount: bool) -> None:
    """Bring the database to the current schema; with -c, also record the configuration's
    versions, apply its migrations to the labels and build the indexes its ``search:``
    paths need (serve and cron do this at start too)."""
    if recount or not options.config_paths:
        migrate_database(database_url(), recount=recount)
    if not options.config_paths:
        click.echo("Database schema is current.")
        return
    config = options.load()
    versions = prepare_database(database_url(), config)
    compute_next_checks(database_url(), config, versions)
    click.echo("Database schema and labels are current.")


@click.group()
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
