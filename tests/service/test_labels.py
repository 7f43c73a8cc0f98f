"""The label core (:mod:`routemaster.service`) through its Python API, on real PostgreSQL."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.config.model import StateMachine
from routemaster.db.plumbing.database import create_engine
from tests.stub_server import StubServer
from tests.waiting import run_together

CONFIG = """
state_machines:
  user:
    feeds:
      - name: checks
        url: {feed_url}
    states:
      - gate: start
        triggers:
          - metadata: ready
          - metadata: payment.status
        exit_condition: metadata.ready = true or metadata.payment.status = "paid"
        next:
          type: context
          path: metadata.route
          default: review
          destinations:
            - value: fast
              state: done
      - gate: review
        triggers:
          - event: entry
          - metadata: approved
        exit_condition: metadata.approved = true
        next: notify
      - action: notify
        webhook: http://127.0.0.1:9/hooks/<label>
        next: checked
      - gate: checked
        triggers:
          - metadata: check
        exit_condition: feeds.checks.ok = true
        next: done
      - gate: done
        exit_condition: false
  pipeline:
    states:
      - action: first
        webhook: http://127.0.0.1:9/first
        next: last
      - gate: last
        exit_condition: false
  loop:
    states:
      - gate: ping
        triggers:
          - event: entry
        exit_condition: true
        next: pong
      - gate: pong
        triggers:
          - event: entry
        exit_condition: true
        next: ping
"""


@pytest.fixture
def make_app(db_engine: sa.Engine, stub: StubServer, tmp_path: Path) -> Callable[..., App]:
    def make(**settings: object) -> App:
        path = tmp_path / "config.yaml"
        path.write_text(CONFIG.format(feed_url=stub.url("/checks/<label>")))
        return App(config=load_config([path]), db=db_engine, settings=Settings(**settings))  # type: ignore[arg-type]

    return make


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app()


@pytest.fixture
def user(app: App) -> StateMachine:
    return app.config.get_machine("user")


def history_moves(
    app: App, machine: StateMachine, name: str
) -> list[tuple[str | None, str | None]]:
    return [(entry.old_state, entry.new_state) for entry in service.history(app, machine, name)]


def test_create_starts_in_the_first_state_with_a_history_entry(
    app: App, user: StateMachine
) -> None:
    label = service.create_label(app, user, "alice", {"a": 1})
    assert (label.state, label.metadata, label.deleted) == ("start", {"a": 1}, False)
    assert label.due_at is None
    entries = service.history(app, user, "alice")
    assert [(entry.old_state, entry.new_state) for entry in entries] == [(None, "start")]
    assert label.entry_id == entries[0].id
    assert service.get_label(app, user, "alice") == label


def test_create_twice_raises_label_exists_also_after_deletion(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {})
    with pytest.raises(service.LabelExists):
        service.create_label(app, user, "alice", {})
    service.delete_label(app, user, "alice")
    with pytest.raises(service.LabelExists):
        service.create_label(app, user, "alice", {})


def test_same_name_in_two_machines_are_two_labels(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {})
    pipeline = app.config.get_machine("pipeline")
    assert service.create_label(app, pipeline, "alice", {}).state == "first"


def test_creating_in_an_action_makes_the_label_due(app: App) -> None:
    label = service.create_label(app, app.config.get_machine("pipeline"), "p", {})
    assert label.state == "first"
    assert label.due_at is not None and label.due_at <= app.now()
    assert label.attempts == 0


def test_get_unknown_raises_not_found(app: App, user: StateMachine) -> None:
    with pytest.raises(service.LabelNotFound):
        service.get_label(app, user, "nobody")


def test_delete_is_soft_idempotent_and_recorded_once(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {"secret": "x"})
    service.delete_label(app, user, "alice")
    service.delete_label(app, user, "alice")
    service.delete_label(app, user, "never-existed")
    deleted = service.get_label(app, user, "alice")
    assert deleted.deleted
    assert deleted.metadata == {}
    assert history_moves(app, user, "alice") == [(None, "start"), ("start", None)]
    with pytest.raises(service.LabelDeleted):
        service.update_metadata(app, user, "alice", {"ready": True})
    assert service.advance(app, user, "alice") is None


def test_update_deep_merges(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {"n": {"keep": 1, "x": 1}, "l": [1], "z": 1})
    label = service.update_metadata(
        app, user, "alice", {"n": {"x": 2, "y": {"d": 1}}, "l": [2], "z": None}
    )
    assert label.metadata == {"n": {"keep": 1, "x": 2, "y": {"d": 1}}, "l": [2], "z": None}
    assert service.update_metadata(app, user, "alice", {"n": 5}).metadata["n"] == 5


def test_update_of_unknown_label_raises_not_found(app: App, user: StateMachine) -> None:
    with pytest.raises(service.LabelNotFound):
        service.update_metadata(app, user, "nobody", {})


def test_update_touching_a_trigger_path_moves_through_gates(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {})
    label = service.update_metadata(app, user, "alice", {"ready": True})
    assert label.state == "review"
    label = service.update_metadata(app, user, "alice", {"approved": True})
    assert label.state == "notify"
    assert label.due_at is not None
    assert history_moves(app, user, "alice") == [
        (None, "start"),
        ("start", "review"),
        ("review", "notify"),
    ]


def test_update_not_touching_a_trigger_path_does_not_evaluate(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "alice", {})
    service.update_metadata(app, user, "alice", {"approved": True})
    assert service.update_metadata(app, user, "alice", {"other": 1}).state == "start"
    # ...until an evaluation is asked for: the condition holds, review's entry trigger fires.
    moved = service.update_metadata(app, user, "alice", {"ready": True})
    assert moved.state == "notify"


def test_a_metadata_trigger_fires_when_the_update_body_contains_its_path(
    app: App, user: StateMachine
) -> None:
    """As in 1.x: the body must contain the nested path itself (its value may be null)."""
    service.create_label(app, user, "a", {})
    assert (
        service.update_metadata(app, user, "a", {"payment": {"status": "paid"}}).state == "review"
    )
    service.create_label(app, user, "b", {"ready": True})  # the condition holds from the start
    for not_firing in (
        {"pay": {"status": 1}},
        {"payment": None},
        {"payment": 5},
        {"payment": [1, 2]},
        {"payment": "xstatusx"},
        {"payment": {"other": 1}},
    ):
        assert service.update_metadata(app, user, "b", not_firing).state == "start", not_firing
    assert service.update_metadata(app, user, "b", {"payment": {"status": None}}).state == "review"


def test_context_next_chooses_by_metadata(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "fast", {"route": "fast"})
    assert service.update_metadata(app, user, "fast", {"ready": True}).state == "done"


def test_advance_moves_a_label_whose_condition_holds(app: App, user: StateMachine) -> None:
    created = service.create_label(app, user, "alice", {})
    with app.db.begin() as connection:
        connection.execute(
            sa.text("UPDATE labels SET metadata = '{\"ready\": true}' WHERE name = 'alice'")
        )
    moved = service.advance(app, user, "alice")
    assert moved is not None and moved.state == "review"
    assert service.advance(app, user, "alice", entry_id=created.entry_id) is None


def test_configuration_loops_are_bounded(make_app: Callable[..., App]) -> None:
    app = make_app(max_transitions=5)
    loop = app.config.get_machine("loop")
    label = service.create_label(app, loop, "spinner", {})
    moves = history_moves(app, loop, "spinner")
    assert 1 < len(moves) <= 1 + 5
    assert label.state == moves[-1][1]


def test_a_feed_read_in_a_metadata_triggered_evaluation(
    app: App, user: StateMachine, stub: StubServer
) -> None:
    service.create_label(app, user, "a/b", {"approved": True})
    service.update_metadata(app, user, "a/b", {"ready": True})
    assert service.get_label(app, user, "a/b").state == "notify"
    moved_on = service.advance(
        app, user, "a/b", entry_id=service.get_label(app, user, "a/b").entry_id
    )
    assert moved_on is not None and moved_on.state == "checked"
    stub.reply_json("/checks/a%2Fb", {"ok": True})
    assert service.update_metadata(app, user, "a/b", {"check": 1}).state == "done"
    assert [request.path for request in stub.received()] == ["/checks/a%2Fb"]


def test_a_feed_that_is_down_keeps_the_update_and_marks_the_label_for_retry(
    app: App, user: StateMachine, stub: StubServer
) -> None:
    service.create_label(app, user, "alice", {"approved": True})
    service.update_metadata(app, user, "alice", {"ready": True})
    service.advance(app, user, "alice", entry_id=service.get_label(app, user, "alice").entry_id)
    stub.reply_json("/checks/alice", {"error": "down"}, status=503)
    label = service.update_metadata(app, user, "alice", {"check": 1})
    assert label.state == "checked"
    assert label.metadata == {"ready": True, "approved": True, "check": 1}
    assert label.last_error is not None and "503" in label.last_error
    assert label.due_at is not None and label.due_at > app.now()


def test_concurrent_creates_have_exactly_one_winner(app: App, user: StateMachine) -> None:
    def create(index: int) -> object:
        try:
            return service.create_label(app, user, "contended", {"creator": index})
        except service.LabelExists:
            return None

    results = run_together(20, create)
    winners = [result for result in results if result is not None]
    assert len(winners) == 1
    assert history_moves(app, user, "contended") == [(None, "start")]


def test_concurrent_updates_lose_nothing(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "contended", {})

    def update(thread: int) -> object:
        for round_ in range(10):
            service.update_metadata(app, user, "contended", {"keys": {f"{thread}-{round_}": 1}})
        return None

    run_together(20, update)
    keys = service.get_label(app, user, "contended").metadata["keys"]
    assert len(keys) == 200


def test_concurrent_triggered_updates_move_the_label_once(app: App, user: StateMachine) -> None:
    service.create_label(app, user, "contended", {})
    run_together(10, lambda _: service.update_metadata(app, user, "contended", {"ready": True}))
    assert history_moves(app, user, "contended") == [(None, "start"), ("start", "review")]


def test_label_is_a_frozen_dataclass(app: App, user: StateMachine) -> None:
    label = service.create_label(app, user, "alice", {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        label.state = "x"  # type: ignore[misc]


def test_a_forced_move_enters_the_state_like_any_other_move(app: App, user: StateMachine) -> None:
    """Into a gate with an entry trigger whose condition holds: it moves on at once."""
    service.create_label(app, user, "alice", {"approved": True})
    moved = service.force_move(app, user, "alice", "review", reason="skip the start")
    assert moved.state == "notify"
    assert moved.due_at is not None  # the action's webhook is owed
    entries = service.history(app, user, "alice")
    assert [(e.old_state, e.new_state, e.forced) for e in entries] == [
        (None, "start", False),
        ("start", "review", True),
        ("review", "notify", False),
    ]


@pytest.mark.parametrize("change", ["update", "pause"])
def test_a_change_racing_the_create_of_its_label_is_never_told_it_was_deleted(
    make_app: Callable[..., App], database_url: str, change: str
) -> None:
    """A PATCH (or an operator's pause) sent with the create of the same label answers the
    label or "not found", never 410.

    Each round creates fresh labels while changing them at once, many pairs at
    a time on their own connections, so some changes look for their label just
    as its create commits.
    """
    engine = create_engine(database_url, pool_size=40, max_overflow=0)
    app = dataclasses.replace(make_app(), db=engine)
    user = app.config.get_machine("user")
    pairs, rounds = 16, 25
    outcomes: dict[str, int] = {}

    def create_or_update(round_: int, index: int) -> object:
        name = f"race-{round_}-{index // 2}"
        if index % 2 == 0:
            return service.create_label(app, user, name, {"created": True})
        try:
            if change == "pause":
                assert service.set_label_paused(app, user, name, True).paused
            else:
                updated = service.update_metadata(app, user, name, {"updated": True})
                assert updated.metadata == {"created": True, "updated": True}
        except service.LabelNotFound:
            return "not found"
        except service.LabelDeleted:
            return "deleted"
        return "changed"

    try:
        for round_ in range(rounds):
            results = run_together(2 * pairs, functools.partial(create_or_update, round_))
            for outcome in results[1::2]:
                outcomes[str(outcome)] = outcomes.get(str(outcome), 0) + 1
    finally:
        engine.dispose()
    assert "deleted" not in outcomes, outcomes
    assert outcomes.get("changed", 0) > 0, outcomes  # the changes did meet their labels
    assert sum(outcomes.values()) == pairs * rounds
