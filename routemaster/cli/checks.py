"""``routemaster validate``: the configuration, and whether the database's labels fit it."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click
import sqlalchemy as sa

from routemaster.cli.environment import late_config_option
from routemaster.cli.options import Options, load_plugins_of, named_database_url
from routemaster.config import config_warnings
from routemaster.config.model import Config
from routemaster.db.database import safe_url
from routemaster.db.errors import describe_failure
from routemaster.db.listings import states_in_use
from routemaster.logging import PluginError


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
