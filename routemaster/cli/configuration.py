"""What ``serve``, ``cron`` and ``migrate -c`` do to the database before they start.

The schema first; then, under the configuration lock, the check that no
label would be stranded (the same message as ``routemaster plan``), each
machine's definition recorded as a version, and the configuration's
``migrations:`` applied to the labels. Last, outside that lock, the indexes
the machines' ``search:`` paths need are built if missing (concurrently:
labels are written meanwhile; each build under its own advisory lock).
"""

from __future__ import annotations

import json
import sys

import click
import sqlalchemy as sa

from routemaster.app import App
from routemaster.cli.options import direct_engine, migrate_database, unreachable
from routemaster.config.graph import describe_machine
from routemaster.config.model import Config
from routemaster.db.history import stamp_versions
from routemaster.db.plumbing.database import create_engine
from routemaster.db.search_indexes import ensure_search_index
from routemaster.db.table_statistics import refresh
from routemaster.db.versions import digest_of
from routemaster.machine.definitions import LoadedVersions
from routemaster.machine.upgrades import stranded_message
from routemaster.service.configuration import (
    LabelsStranded,
    abort_older_labels,
    apply_migrations,
    record_configuration,
)
from routemaster.service.scheduling import schedule_unscheduled
from routemaster.service.versions import load_all_versions

Versions = dict[str, int]
"""Machine -> the version of its definition this process runs."""


def prepare_database(url: str, config: Config) -> Versions:
    """Schema, stranded check, versions, migrations; exit 1 with one message on a problem.

    Returns the versions, for :func:`stamp_versions` on the process's engine.
    """
    migrate_database(url)
    # One connection holds the lock; moves need one more (and one for a feed read after).
    engine = create_engine(url, pool_size=2, max_overflow=2)
    app = App(config=config, db=engine, direct=direct_engine())
    try:
        recorded = record_configuration(app)
        versions = recorded.versions
        stamp_versions(engine, versions, continuing(config))
        app.versions = LoadedVersions(in_force=versions)
        migrated = apply_migrations(app, wait=True)
        aborted = abort_older_labels(app, recorded)
        built = _build_search_indexes(app, config)
    except LabelsStranded as stranded:
        click.echo(stranded_message(stranded.plan), err=True)
        sys.exit(1)
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        app.http.close()
        engine.dispose()
        if app.direct is not None:
            app.direct.dispose()
    if migrated:
        click.echo(f"Migrated {migrated} labels to the configuration.", err=True)
    if aborted:
        click.echo(
            f"Aborted {aborted} labels of older versions (upgrade_strategy: abort).", err=True
        )
    for machine, path in built:
        click.echo(f"Built the search index of {machine}'s metadata.{path}.", err=True)
    return versions


def checked_by_parent(versions: Versions, config: Config) -> str:
    """What ``serve`` hands its children (``--checked``) once it prepared the database.

    Each machine's version with the digest of the definition it was recorded
    for, so a child whose configuration differs (a file changed meanwhile)
    sees it and prepares the database itself.
    """
    return json.dumps(
        {name: [versions[name], digest] for name, digest in _digests(config).items()},
        sort_keys=True,
        separators=(",", ":"),
    )


def prepared_database(url: str, config: Config, checked: str | None) -> Versions:
    """A process's versions: those its parent ``serve`` checked (``checked``), when they are
    of this very configuration; else :func:`prepare_database`'s, checked here.

    ``serve`` prepares the database once, before starting its API and worker:
    the children trust it rather than each repeating the check (and its lines).
    """
    if checked is not None:
        given = json.loads(checked)
        if {name: digest for name, (_, digest) in given.items()} == _digests(config):
            return {name: int(version) for name, (version, _) in given.items()}
    return prepare_database(url, config)


def _digests(config: Config) -> dict[str, str]:
    """Each machine's definition digest, as its stored version records it."""
    return {machine.name: digest_of(describe_machine(machine)) for machine in config.state_machines}


def continuing(config: Config) -> list[str]:
    """The machines whose history rows carry the label's own version (``continue``)."""
    return [machine.name for machine in config.state_machines if machine.continues]


NEXT_CHECK_BATCH = 5000


def compute_next_checks(url: str, config: Config, versions: Versions) -> int:
    """``migrate -c``: every row written without a next check gets one, in bounded batches.

    Each batch is one short transaction over rows found through an index
    (``labels_unscheduled``), passing over rows another transaction holds: the
    API and the workers go on meanwhile, and workers doing the same share the rows. ``serve`` and
    ``cron`` leave this to the workers, so they start at once. ``versions``: the ones
    :func:`prepare_database` recorded; a ``continue`` machine's label is scheduled by its own
    version's gate (SPEC E4).
    """
    engine = create_engine(url, pool_size=1, max_overflow=0)
    app = App(config=config, db=engine, versions=LoadedVersions(in_force=versions))
    total = 0
    try:
        load_all_versions(app)
        while True:
            done = schedule_unscheduled(app, limit=NEXT_CHECK_BATCH)
            total += done
            if done < NEXT_CHECK_BATCH:
                break
            if total % (20 * NEXT_CHECK_BATCH) == 0:
                click.echo(f"Computed the next checks of {total} labels...", err=True)
        # that many rows rewritten: the planner's statistics describe them as they are now
        refresh(engine, {"labels": total})
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        app.http.close()
        engine.dispose()
    if total:
        click.echo(f"Computed the next checks of {total} labels.", err=True)
    return total


def _build_search_indexes(app: App, config: Config) -> list[tuple[str, str]]:
    """Each machine's ``search:`` indexes that were missing, built: (machine, path) of each."""
    return [
        (machine.name, ".".join(path))
        for machine in config.state_machines
        for path in machine.search
        if ensure_search_index(app.db, machine.name, path, direct=app.direct)
    ]
