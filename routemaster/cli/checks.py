"""``routemaster validate``: the configuration, and whether the database's labels fit it.

Labels fit when none would be stranded: the check ``plan``, ``serve`` and ``cron`` make.
"""

from __future__ import annotations

import sys

import click
import sqlalchemy as sa

from routemaster.app import App
from routemaster.cli.environment import late_config_option
from routemaster.cli.options import Options, load_plugins_of, named_database_url
from routemaster.config import config_warnings
from routemaster.config.model import Config
from routemaster.db.errors import describe_failure
from routemaster.db.plumbing.database import safe_url
from routemaster.logging import PluginError
from routemaster.machine.upgrades import ConfigPlan, stranded_message
from routemaster.service.configuration import stranding_plan


@click.command()
@late_config_option
@click.pass_obj
def validate(options: Options) -> None:
    """Check the config; with DATABASE_URL (or DB_*) set, also that every label's state exists."""
    config = options.load()
    try:
        load_plugins_of(config)
    except PluginError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    for warning in config_warnings(config):
        click.echo(f"warning: {warning}", err=True)
    url = named_database_url()
    if url:
        plan = _plan(url, config)
        if isinstance(plan, str):
            click.echo(f"warning: {plan}; labels not checked", err=True)
        elif plan.strands_labels:
            click.echo(stranded_message(plan), err=True)
            sys.exit(1)
    click.echo(f"Config valid: {len(config.state_machines)} state machines")


def _plan(url: str, config: Config) -> ConfigPlan | str:
    """What the config changes for the database's labels, or why they could not be read."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 5})
    try:
        return stranding_plan(App(config=config, db=engine))
    except sa.exc.SQLAlchemyError as error:
        return f"database at {safe_url(url)} not usable ({describe_failure(error).detail})"
    finally:
        engine.dispose()
