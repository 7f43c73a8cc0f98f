"""What ``serve``, ``cron`` and ``migrate -c`` do to the database before they start.

The schema first; then, under the configuration lock, the check that no
label would be stranded (the same message as ``routemaster plan``), each
machine's definition recorded as a version, and the configuration's
``migrations:`` applied to the labels. Last, outside that lock, the indexes
the machines' ``search:`` paths need are built if missing (concurrently:
labels are written meanwhile; each build under its own advisory lock).
"""

from __future__ import annotations

import sys

import click
import sqlalchemy as sa

from routemaster.app import App
from routemaster.cli.options import migrate_database, unreachable
from routemaster.config.model import Config
from routemaster.db.database import create_engine
from routemaster.db.search_indexes import ensure_search_index
from routemaster.db.versions import stamp_connections
from routemaster.machine.upgrades import stranded_message
from routemaster.service.configuration import LabelsStranded, apply_migrations, record_configuration
from routemaster.service.scheduling import schedule_unscheduled

Versions = dict[str, int]
"""Machine -> the version of its definition this process runs."""


def prepare_database(url: str, config: Config) -> Versions:
    """Schema, stranded check, versions, migrations; exit 1 with one message on a problem.

    Returns the versions, for :func:`stamp_connections` on the process's engine.
    """
    migrate_database(url)
    # One connection holds the lock; moves need one more (and one for a feed read after).
    engine = create_engine(url, pool_size=2, max_overflow=2)
    app = App(config=config, db=engine)
    try:
        versions = record_configuration(app)
        engine.dispose()  # the migrations' history rows carry the new versions
        stamp_connections(engine, versions)
        migrated = apply_migrations(app, wait=True)
        built = _build_search_indexes(engine, config)
    except LabelsStranded as stranded:
        click.echo(stranded_message(stranded.plan), err=True)
        sys.exit(1)
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        app.http.close()
        engine.dispose()
    if migrated:
        click.echo(f"Migrated {migrated} labels to the configuration.", err=True)
    for machine, path in built:
        click.echo(f"Built the search index of {machine}'s metadata.{path}.", err=True)
    return versions


NEXT_CHECK_BATCH = 5000


def compute_next_checks(url: str, config: Config) -> int:
    """``migrate -c``: every row written without a next check gets one, in bounded batches.

    Each batch is one short transaction over rows found through an index
    (``labels_unscheduled``), with ``SKIP LOCKED``: the API and the workers go
    on meanwhile, and workers doing the same share the rows. ``serve`` and
    ``cron`` leave this to the workers, so they start at once.
    """
    engine = create_engine(url, pool_size=1, max_overflow=0)
    app = App(config=config, db=engine)
    total = 0
    try:
        while True:
            done = schedule_unscheduled(app, limit=NEXT_CHECK_BATCH)
            total += done
            if done < NEXT_CHECK_BATCH:
                break
            if total % (20 * NEXT_CHECK_BATCH) == 0:
                click.echo(f"Computed the next checks of {total} labels...", err=True)
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        app.http.close()
        engine.dispose()
    if total:
        click.echo(f"Computed the next checks of {total} labels.", err=True)
    return total


def _build_search_indexes(engine: sa.Engine, config: Config) -> list[tuple[str, str]]:
    """Each machine's ``search:`` indexes that were missing, built: (machine, path) of each."""
    return [
        (machine.name, ".".join(path))
        for machine in config.state_machines
        for path in machine.search
        if ensure_search_index(engine, machine.name, path)
    ]
