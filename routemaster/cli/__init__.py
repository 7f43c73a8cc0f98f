"""The ``routemaster`` command: serve the API, run the worker, check a config, manage the database.

Every process builds its own :class:`~routemaster.app.App` here and hands it
to the API or the worker; nothing else in the package reads the environment
or the command line.
"""

from __future__ import annotations

import logging

import click

from routemaster import __version__
from routemaster.cli.checks import validate
from routemaster.cli.cron import cron
from routemaster.cli.database import db, migrate
from routemaster.cli.options import Options
from routemaster.cli.plan import plan
from routemaster.cli.serve import serve
from routemaster.cli.tokens import token
from routemaster.cli.work import work


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
    ctx.obj = Options(config_paths)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
    )


for command in (serve, cron, validate, plan, migrate, db, token, work):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="routemaster")
