"""Configuration migrations on live labels: renames keep the entry, moves enter the target."""

from __future__ import annotations

import datetime

import sqlalchemy as sa

from routemaster import service
from routemaster.app import App, utc_now
from routemaster.db import labels as store
from routemaster.metrics import Metrics
from routemaster.service.configuration import apply_migrations, record_configuration
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running

OLD_ACTION = """
state_machines:
  m:
    retry: {max_attempts: 5, initial_delay: 30s, max_delay: 30s}
    states:
      - action: ping
        webhook: "{stub}/ping/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

NEW_ACTION = """
state_machines:
  m:
    retry: {max_attempts: 5, initial_delay: 30s, max_delay: 30s}
    states:
      - action: notify
        webhook: "{stub}/ping/<label>"
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: ping, to: notify}
"""


def _label(app: App, name: str) -> store.Label:
    with app.db.connect() as conn:
        found = store.get(conn, "m", name)
    assert found is not None
    return found


def _history(app: App, name: str) -> list[tuple[str | None, str | None, bool, str | None]]:
    with app.db.connect() as conn:
        entries = store.history(conn, "m", name)
    return [(e.old_state, e.new_state, e.forced, e.reason) for e in entries]


def _token(stub: StubServer, path: str) -> list[str]:
    return [
        value
        for request in stub.received(path)
        for key, value in request.headers.items()
        if key.lower() == "x-idempotency-token"
    ]


def test_renaming_an_action_keeps_its_entry_and_sends_no_second_webhook(
    make_app: MakeApp, stub: StubServer
) -> None:
    old = make_app(OLD_ACTION, lease=datetime.timedelta(seconds=600))
    new = make_app(NEW_ACTION)
    stub.script("/ping/slow", Reply(200, delay=1.5))
    stub.script("/ping/failed", Reply(500), Reply(200))
    for name in ("slow", "failed"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    with running(old):
        wait_until(lambda: len(stub.received()) == 2, "both webhooks sent", timeout=10)
        wait_until(lambda: _leased(old, "failed") == 0, "retry recorded", timeout=10)
        failed = _label(old, "failed")
        # Applied while slow's webhook is in flight.
        assert record_configuration(new).versions == {"m": 1}
        assert apply_migrations(new, wait=True) == 1
        renamed = _label(new, "failed")
        assert renamed.state == "notify"
        kept = ("entry_id", "state_entered_at", "previous_state", "attempts", "due_at")
        assert [getattr(renamed, k) for k in kept] == [getattr(failed, k) for k in kept]
        assert _history(new, "failed")[-1] == (
            "ping",
            "notify",
            True,
            "migration: rename ping -> notify",
        )
        # The in-flight delivery is finished by the worker that sent it.
        wait_until(lambda: _label(old, "slow").state == "done", "slow delivered", timeout=10)
    assert apply_migrations(new, wait=True) == 0
    later = make_app(NEW_ACTION, clock=lambda: utc_now() + datetime.timedelta(seconds=60))
    with running(later):
        wait_until(lambda: _label(new, "failed").state == "done", "failed retried", timeout=10)
    assert len(stub.received("/ping/slow")) == 1
    assert _token(stub, "/ping/failed") == [str(failed.entry_id)] * 2  # the retry, not a resend
    assert [s for _, s, _, _ in _history(new, "slow")] == ["ping", "done"]


GATES = """
state_machines:
  m:
    states:
      - gate: {first}
        triggers: [{{metadata: go}}]
        exit_condition: metadata.go and 1h has not passed since history.entered_state
        next: done
      - gate: done
        exit_condition: false
"""


def test_renaming_a_gate_keeps_when_labels_entered_it(make_app: MakeApp) -> None:
    old = make_app(GATES.format(first="waiting"))
    new = make_app(
        GATES.format(first="holding") + "    migrations:\n"
        "      - rename: {from: waiting, to: holding}\n"
    )
    for name in ("a", "b"):
        service.create_label(old, old.config.get_machine("m"), name, {})
    before = _label(old, "a")
    record_configuration(new)
    new.metrics = Metrics()
    assert apply_migrations(new, wait=True, batch=1) == 2  # in batches
    migrated = {
        "state_machine": "m",
        "kind": "rename",
        "from_state": "waiting",
        "to_state": "holding",
    }
    assert (
        new.metrics.registry().get_sample_value("routemaster_labels_migrated_total", migrated) == 2
    )
    after = _label(new, "a")
    assert (after.state, after.entry_id, after.state_entered_at) == (
        "holding",
        before.entry_id,
        before.state_entered_at,
    )
    # A process still on the old configuration updates a label it no longer knows the state
    # of: the metadata is merged, the label is not evaluated (and nothing crashes).
    untouched = service.update_metadata(old, old.config.get_machine("m"), "b", {"go": True})
    assert (untouched.state, untouched.metadata) == ("holding", {"go": True})
    moved = service.update_metadata(new, new.config.get_machine("m"), "a", {"go": True})
    assert moved.state == "done"
    assert _history(new, "a") == [
        (None, "waiting", False, None),
        ("waiting", "holding", True, "migration: rename waiting -> holding"),
        ("holding", "done", False, None),
    ]


MOVES_OLD = """
state_machines:
  m:
    states:
      - gate: start
        triggers: [{event: entry}]
        exit_condition: metadata.stop
        next:
          type: context
          path: metadata.how
          default: cancelled
          destinations: [{value: expire, state: expired}]
      - gate: cancelled
        exit_condition: false
      - gate: expired
        exit_condition: false
"""

MOVES_NEW = """
state_machines:
  m:
    states:
      - gate: start
        triggers: [{event: entry}]
        exit_condition: metadata.stop
        next:
          type: context
          path: metadata.how
          default: review
          destinations: [{value: expire, state: notify}]
      - gate: review
        triggers: [{event: entry}]
        exit_condition: metadata.auto
        next: done
      - action: notify
        webhook: "{stub}/notify/<label>"
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - move: {from: cancelled, to: review}
      - move: {from: expired, to: notify}
"""


def test_moves_enter_the_target_as_a_forced_move_does(make_app: MakeApp, stub: StubServer) -> None:
    old = make_app(MOVES_OLD)
    new = make_app(MOVES_NEW)
    machine = old.config.get_machine("m")
    service.create_label(old, machine, "auto", {"stop": True, "auto": True})
    service.create_label(old, machine, "manual", {"stop": True})
    service.create_label(old, machine, "late", {"stop": True, "how": "expire"})
    assert [_label(old, n).state for n in ("auto", "manual", "late")] == [
        "cancelled",
        "cancelled",
        "expired",
    ]
    record_configuration(new)
    assert apply_migrations(new, wait=True) == 3
    # Into a gate with an entry trigger: evaluated at once.
    assert _label(new, "auto").state == "done"
    assert _label(new, "manual").state == "review"
    assert _history(new, "auto")[-2:] == [
        ("cancelled", "review", True, "migration: move cancelled -> review"),
        ("review", "done", False, None),
    ]
    # Into an action: its webhook is delivered.
    late = _label(new, "late")
    assert (late.state, late.due_at is not None) == ("notify", True)
    with running(new):
        wait_until(lambda: _label(new, "late").state == "done", "late delivered", timeout=10)
    assert len(stub.received("/notify/late")) == 1
    history_rows = _count(new, "SELECT count(*) FROM history")
    assert apply_migrations(new, wait=True) == 0  # applied again: nothing changes
    assert _count(new, "SELECT count(*) FROM history") == history_rows


def _leased(app: App, name: str) -> int:
    return _count(
        app, f"SELECT count(*) FROM labels WHERE name = '{name}' AND lease_owner IS NOT NULL"
    )


def _count(app: App, sql: str) -> int:
    with app.db.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())
