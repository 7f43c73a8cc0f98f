"""``routemaster plan``: what this configuration would change, against the one last applied."""

from __future__ import annotations

import json
import sys

import click
import sqlalchemy as sa

from routemaster.app import App
from routemaster.cli.environment import database_url, late_config_option
from routemaster.cli.options import Options, unreachable
from routemaster.db.database import create_engine
from routemaster.machine.upgrades import plan_as_json, plan_as_text, stranded_message
from routemaster.service.configuration import current_plan


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@late_config_option
@click.pass_obj
def plan(options: Options, as_json: bool) -> None:
    """Per machine and state, what changes and how many labels it concerns; exit 1 if any
    would be stranded (in a state the configuration lacks, with no migration)."""
    config = options.load()
    url = database_url()
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        found = current_plan(App(config=config, db=engine))
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(plan_as_json(found), indent=2))
    else:
        for line in plan_as_text(found):
            click.echo(line)
    if found.strands_labels:
        click.echo(stranded_message(found), err=True)
        sys.exit(1)
