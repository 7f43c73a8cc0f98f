"""Bulk commands: one operator command over every label a search matched.

A job is accepted with the set of labels that matched then (``accept``);
workers carry it out in batches (``run_batch``). Each batch is one
transaction: its items are claimed (items another worker holds are passed
over: :func:`routemaster.db.bulk.claim_items`), each label is locked,
checked again against the job's filters (the expression evaluated by the
gate evaluator on the label as it is now) and changed with the
operator command's own code, recorded as forced with the job's reason, and
the items' outcomes are written before the commit. A label that no longer
qualifies (moved on, retried, resumed, deleted meanwhile) is skipped; one
whose change fails in the database is counted failed: the batch is rolled
back and run again with a savepoint per label, so only that label's change
is undone.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from routemaster.app import App
from routemaster.config.model import StateMachine
from routemaster.db import bulk as jobs
from routemaster.db import labels as store
from routemaster.db import table_statistics, transitions
from routemaster.db.labels import Label
from routemaster.db.search import Search, not_on_version, search_count, search_page
from routemaster.exit_conditions import ConditionSyntaxError, Program, compile_condition
from routemaster.machine.planning import context_for
from routemaster.service.child_words import note_deleted
from routemaster.service.labels import log_transition
from routemaster.service.operations import move_locked, pause_locked, retry_locked
from routemaster.service.refusals import InvalidOperation, Malformed
from routemaster.service.scheduling import plan_input_of, store_after_update
from routemaster.service.search import listing_search
from routemaster.service.transactions import read, reading, writing

COMMANDS = ("retry", "pause", "resume", "move", "delete", "upgrade")
FILTERS = ("where", "state", "errored", "prefix")


class CannotUpgrade(Exception):
    """The version in force lacks the label's state and no migration names it: counted failed."""


class CountMismatch(Exception):
    """The filters match a different number of labels than the caller expected."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} labels match")
        self.count = count


@dataclass(frozen=True)
class BulkCommand:
    """What to do (``command``, ``to`` for a move), why, and to which labels."""

    command: str
    reason: str
    where: str | None = None
    state: str | None = None
    errored: bool = False
    prefix: str = ""
    to: str | None = None
    until: datetime.datetime | None = None  # pause only: each label resumes by itself then

    def arguments(self) -> str:
        """The filters and arguments as stored with the job (JSON)."""
        return json.dumps(
            {
                "where": self.where,
                "state": self.state,
                "errored": self.errored,
                "prefix": self.prefix,
                "to": self.to,
            }
        )


def command_from(body: Mapping[str, Any], *, until: datetime.datetime | None) -> BulkCommand:
    """The command a request asks for (its fields checked against the ``Bulk`` schema)."""
    return BulkCommand(
        command=body["command"],
        reason=body["reason"],
        where=body.get("where"),
        state=body.get("state"),
        errored=bool(body.get("errored")),
        prefix=body.get("prefix") or "",
        to=body.get("to"),
        until=until,
    )


def labels_for(app: App, machine: StateMachine, command: BulkCommand) -> Search:
    """The labels ``command`` is for, or :class:`Malformed` saying what cannot be done.

    What a schema cannot check: the state to move to, a machine an upgrade
    applies to, a version to upgrade to.
    """
    if command.to is not None:
        try:
            machine.get_state(command.to)
        except KeyError:
            raise Malformed(
                f"State machine {machine.name!r} has no state {command.to!r}."
            ) from None
    if command.command == "upgrade" and not machine.continues:
        raise Malformed(
            f"State machine {machine.name!r} has upgrade_strategy {machine.upgrade_strategy}:"
            " only the labels of a continue machine keep a version to upgrade from."
        )
    if command.command == "upgrade" and app.versions.in_force.get(machine.name) is None:
        raise Malformed("This process recorded no version of the machine to upgrade to.")
    search = listing_search(
        app,
        machine,
        command.where,
        state=command.state,
        errored=command.errored,
        prefix=command.prefix,
    )
    if command.command == "upgrade":  # only labels not on the version in force yet
        search = not_on_version(search, app.versions.in_force[machine.name])
    return search


def accept(app: App, search: Search, command: BulkCommand, *, expect: int) -> tuple[int, int]:
    """Record the job with the labels ``search`` matches now: ``(id, count)``.

    Raises :class:`CountMismatch` (and records nothing) unless exactly
    ``expect`` labels match.
    """
    with writing(app) as conn:
        job, count = jobs.accept_job(
            conn,
            search,
            command=command.command,
            arguments=command.arguments(),
            reason=command.reason,
            now=app.now(),
            pause_until=command.until,
        )
        if count != expect:
            raise CountMismatch(count)
    return job, count


get_job = read(jobs.get_job)


def run_batch(app: App, *, limit: int) -> int:
    """Carry out up to ``limit`` pending labels of running jobs; how many were handled.

    A batch runs without savepoints; if a label's change fails in the
    database, the whole batch rolls back and runs again with a savepoint per
    label, so that label alone is counted failed.
    """
    try:
        handled = _batch(app, limit, careful=False)
    except sa.exc.DBAPIError as error:
        if error.connection_invalidated:
            raise
        handled = _batch(app, limit, careful=True)
    if handled:  # a job over a million labels works through them batch by batch
        written = {"labels": handled, "history": handled}
        table_statistics.refresh(app.db, written, direct=app.direct)
    return handled


def _batch(app: App, limit: int, *, careful: bool) -> int:
    now = app.now()
    handled: Counter[tuple[str, str, str]] = Counter()
    with writing(app) as conn:
        items = jobs.claim_items(conn, limit=limit)
        by_job: dict[int, list[jobs.Item]] = {}
        for item in items:
            by_job.setdefault(item.job_id, []).append(item)
        for job_id, pending in by_job.items():
            job = jobs.get_job(conn, job_id)
            assert job is not None, "items belong to a job"
            runner = _JobRunner(app, job, now, careful=careful)
            outcomes = [(item.name_key, runner.handle(conn, item.name)) for item in pending]
            jobs.record_outcomes(conn, job_id, outcomes, now=now)
            handled.update((job.state_machine, job.command, outcome) for _, outcome in outcomes)
    if app.metrics is not None:  # counted once committed
        for labels, count in handled.items():
            app.metrics.bulk_labels.labels(*labels).inc(count)
    return len(items)


class _JobRunner:
    """One job's commands within a batch: its machine and its expression, compiled once."""

    def __init__(self, app: App, job: jobs.Job, now: datetime.datetime, *, careful: bool) -> None:
        self.app = app
        self.careful = careful
        self.job = job
        self.now = now
        self.arguments: Mapping[str, Any] = job.arguments
        where = self.arguments.get("where")
        self.program: Program | None = None
        self.machine: StateMachine | None = None
        try:
            self.program = compile_condition(where) if where is not None else None
            self.machine = app.config.get_machine(job.state_machine)
        except (KeyError, ConditionSyntaxError):
            pass  # the machine left the configuration, or the language changed: all fail

    def handle(self, conn: sa.Connection, name: str) -> str:
        """``done``, ``skipped`` (no longer qualifies) or ``failed`` for one label."""
        if self.machine is None:
            return "failed"
        if not self.careful:
            return self._change(conn, self.machine, name)
        try:
            with conn.begin_nested():
                return self._change(conn, self.machine, name)
        except sa.exc.DBAPIError as error:
            if error.connection_invalidated:
                raise
            return "failed"

    def _change(self, conn: sa.Connection, machine: StateMachine, name: str) -> str:
        label = store.lock(conn, machine.name, name)
        if label is None or not self._qualifies(label):
            return "skipped"
        try:
            self._apply(conn, machine, label)
        except InvalidOperation:  # raised before anything is written
            return "skipped"
        except CannotUpgrade:  # raised before anything is written
            return "failed"
        return "done"

    def _qualifies(self, label: Label) -> bool:
        arguments = self.arguments
        if label.deleted:
            return False
        if arguments.get("state") is not None and label.state != arguments["state"]:
            return False
        if arguments.get("errored") and not label.errored:
            return False
        if not label.name.startswith(arguments.get("prefix") or ""):
            return False
        command = self.job.command
        if (command == "retry" and not label.errored) or (
            command in ("pause", "resume") and label.paused == (command == "pause")
        ):
            return False
        if command == "upgrade" and label.version in (
            None,
            self.app.versions.in_force.get(label.state_machine),
        ):
            return False
        return self.program is None or self.program.evaluate(
            context_for(plan_input_of(label), self.now)
        )

    def _apply(self, conn: sa.Connection, machine: StateMachine, label: Label) -> None:
        command, reason, now = self.job.command, self.job.reason, self.now
        if command == "retry":
            retry_locked(conn, label, now=now, reason=reason)
        elif command in ("pause", "resume"):
            until = self.job.pause_until if command == "pause" else None
            pause_locked(conn, label, command == "pause", now=now, reason=reason, until=until)
        elif command == "move":
            to = str(self.arguments["to"])
            move_locked(conn, self.app, machine, label, to, now=now, reason=reason)
        elif command == "upgrade":
            upgrade_locked(conn, self.app, machine, label, now=now, reason=reason)
        elif command == "delete":
            transitions.record_forced(conn, label, now=now, reason=reason)
            old_state = transitions.soft_delete(conn, machine.name, label.name, now=now)
            note_deleted(conn, self.app.config, [label.key])  # a child counts as failed
            log_transition(self.app, machine.name, label.name, old_state, None, forced=True)
        else:
            raise InvalidOperation(f"unknown bulk command {command!r}")


def upgrade_locked(
    conn: sa.Connection,
    app: App,
    machine: StateMachine,
    label: Label,
    *,
    now: datetime.datetime,
    reason: str,
) -> None:
    """Put a locked label of a ``continue`` machine on the version in force (``machine``).

    In a state the version in force has, it stays where it is (a forced
    history entry records the upgrade); in a state the configuration's
    ``migrations:`` rename, it is renamed, keeping its entry; in one they
    move, it enters the target as a forced move does. Otherwise
    :class:`CannotUpgrade`, with nothing written.
    """
    version = app.versions.in_force.get(machine.name)
    if version is None:
        raise CannotUpgrade("this process recorded no version of the machine")
    migration = next((m for m in machine.migrations if m.from_state == label.state), None)
    known = any(state.name == label.state for state in machine.states)
    if not known and migration is None:
        raise CannotUpgrade(f"version {version} has no state {label.state!r} and no migration")
    if known:
        transitions.set_version(conn, machine.name, label.name, version, now=now)
        # The forced entry carries the version the label follows from now on.
        transitions.record_forced(
            conn, dataclasses.replace(label, version=version), now=now, reason=reason
        )
        # Waiting in a gate: now due by the version in force's condition and triggers.
        store_after_update(conn, app, machine, dataclasses.replace(label, version=version))
    elif migration is not None and migration.kind == "rename":
        transitions.rename(
            conn,
            machine.name,
            label.name,
            old=label.state,
            new=migration.to_state,
            version=version,
            reason=reason,
            now=now,
        )
        log_transition(app, machine.name, label.name, label.state, migration.to_state, forced=True)
    elif migration is not None:
        transitions.set_version(conn, machine.name, label.name, version, now=now)
        upgraded = dataclasses.replace(label, version=version)  # moved by the version in force
        move_locked(conn, app, machine, upgraded, migration.to_state, now=now, reason=reason)


SAMPLE_SIZE = 20


def dry_run(app: App, search: Search) -> dict[str, Any]:
    """How many labels match now, and the first few of them."""
    with reading(app) as conn:
        sample = [name for name, _ in search_page(conn, search, after="", limit=SAMPLE_SIZE)]
        return {"count": search_count(conn, search), "sample": sample}
