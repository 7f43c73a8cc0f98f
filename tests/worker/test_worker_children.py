"""Fan-out and fan-in in a worker (SPEC G3): children spawned once each, the parent decides
by ``wait`` as soon as the deciding child finishes, ``on_exit`` and operators' moves."""

from __future__ import annotations

import time

from routemaster import service
from routemaster.app import App
from routemaster.db.changes import Position, read_changes
from routemaster.service.operations import force_move
from tests.waiting import wait_until
from tests.worker.children import config, rows
from tests.worker.conftest import MakeApp, running


def _spawned(app: App, items: list[object]) -> None:
    """``o1`` created with ``items`` to spawn from, and every child of it spawned."""
    service.create_label(app, app.config.get_machine("order"), "o1", {"items": items})
    wait_until(lambda: len(_children(app)) == len(items), f"{len(items)} children")


def _children(app: App, parent: str = "o1") -> list[tuple[object, ...]]:
    return rows(
        app,
        "SELECT labels.name, labels.state, labels.deleted FROM children JOIN labels"
        " USING (state_machine, name_key, shard_key) WHERE children.parent_name = %(parent)s"
        " ORDER BY children.position",
        parent=parent,
    )


def _state(app: App, name: str, machine: str = "order") -> str:
    return service.get_label(app, app.config.get_machine(machine), name).state


def _moves(app: App, name: str) -> list[tuple[object, ...]]:
    return rows(
        app,
        "SELECT old_state, new_state, forced, reason FROM history WHERE label = %(name)s"
        " ORDER BY id",
        name=name,
    )


def test_a_parent_waits_for_all_its_children_then_leaves_by_their_counts(
    make_app: MakeApp,
) -> None:
    app = make_app(config())
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, ["a", "b", "c"])
        child = service.get_label(app, item, "o1/1")
        assert child.metadata == {"item": "b", "parent": {"state_machine": "order", "label": "o1"}}
        service.update_metadata(app, item, "o1/0", {"ok": True})
        service.update_metadata(app, item, "o1/1", {"ok": True})
        service.update_metadata(app, item, "o1/2", {"bad": True})
        started = time.monotonic()
        wait_until(lambda: _state(app, "o1") == "partial", "decided: one child failed")
        assert time.monotonic() - started < 1.5
    assert _moves(app, "o1") == [(None, "pick", False, None), ("pick", "partial", False, None)]


def test_all_succeeded_takes_the_destination_for_no_failures(make_app: MakeApp) -> None:
    app = make_app(config())
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2])
        service.update_metadata(app, item, "o1/0", {"ok": True})
        time.sleep(0.5)  # the parent was woken and counted one child running: it waits
        assert _state(app, "o1") == "pick"
        service.update_metadata(app, item, "o1/1", {"ok": True})
        wait_until(lambda: _state(app, "o1") == "done", "decided: none failed")


def test_an_empty_list_decides_at_once(make_app: MakeApp) -> None:
    app = make_app(config())
    with running(app):
        service.create_label(app, app.config.get_machine("order"), "o1", {"items": []})
        wait_until(lambda: _state(app, "o1") == "done", "nothing to wait for")


def test_wait_any_decides_on_the_first_success_and_keeps_the_others(make_app: MakeApp) -> None:
    app = make_app(config(wait="any"))
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2, 3])
        service.update_metadata(app, item, "o1/2", {"bad": True})
        service.update_metadata(app, item, "o1/1", {"ok": True})
        wait_until(lambda: _state(app, "o1") == "partial", "decided on the first success")
        time.sleep(1.5)  # on_exit: keep: nothing touches the child still running
    assert _children(app) == [
        ("o1/0", "waiting", False),
        ("o1/1", "picked", False),
        ("o1/2", "broken", False),
    ]


def test_at_least_waits_for_that_many_successes(make_app: MakeApp) -> None:
    app = make_app(config(wait="{at_least: 2}"))
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2, 3, 4])
        service.update_metadata(app, item, "o1/0", {"ok": True})
        service.update_metadata(app, item, "o1/1", {"bad": True})
        time.sleep(0.5)
        assert _state(app, "o1") == "pick"
        service.update_metadata(app, item, "o1/3", {"ok": True})
        wait_until(lambda: _state(app, "o1") == "partial", "two succeeded")


def test_on_exit_delete_deletes_the_children_still_running(make_app: MakeApp) -> None:
    app = make_app(config(wait="any", on_exit="delete"))
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2, 3])
        service.update_metadata(app, item, "o1/1", {"ok": True})
        wait_until(
            lambda: (
                _children(app)
                == [("o1/0", "waiting", True), ("o1/1", "picked", False), ("o1/2", "waiting", True)]
            ),
            "the two children still running deleted",
        )
    assert _state(app, "o1") == "done"
    assert _moves(app, "o1/0")[-2:] == [
        ("waiting", "waiting", True, "on_exit: delete: order/o1 left pick"),
        ("waiting", None, False, "deleted"),
    ]


def test_a_child_deleted_counts_as_failed(make_app: MakeApp) -> None:
    app = make_app(config())
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2])
        service.update_metadata(app, item, "o1/0", {"ok": True})
        service.delete_label(app, item, "o1/1")
        wait_until(lambda: _state(app, "o1") == "partial", "the deleted child failed")


def test_a_parent_deleted_while_children_run_takes_them_with_it(make_app: MakeApp) -> None:
    app = make_app(config(on_exit="delete"))
    order = app.config.get_machine("order")
    with running(app):
        _spawned(app, [1, 2])
        service.delete_label(app, order, "o1")
        wait_until(
            lambda: [deleted for _, _, deleted in _children(app)] == [True, True],
            "both children deleted",
        )
    assert rows(app, "SELECT count(*) FROM spawns") == [(0,)]


def test_a_parent_deleted_with_on_exit_keep_leaves_its_children_running(
    make_app: MakeApp,
) -> None:
    app = make_app(config())
    order, item = app.config.get_machine("order"), app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2])
        service.delete_label(app, order, "o1")
        wait_until(lambda: rows(app, "SELECT count(*) FROM spawns") == [(0,)], "forgotten")
        service.update_metadata(app, item, "o1/0", {"ok": True})  # a word nobody waits for
        wait_until(lambda: rows(app, "SELECT count(*) FROM child_wakes") == [(0,)], "taken")
    assert _children(app) == [("o1/0", "picked", False), ("o1/1", "waiting", False)]


def test_an_operator_moving_the_parent_on_deletes_its_children(make_app: MakeApp) -> None:
    app = make_app(config(on_exit="delete"))
    order = app.config.get_machine("order")
    with running(app):
        _spawned(app, [1, 2])
        force_move(app, order, "o1", "done", reason="by hand")
        wait_until(
            lambda: [deleted for _, _, deleted in _children(app)] == [True, True],
            "both children deleted",
        )


NESTED = """
state_machines:
  node:
    states:
      - spawn: split
        machine: node
        for_each: metadata.item
        next: leaf
      - gate: leaf
        exit_condition: false
        outcome: succeeded
"""


def test_a_chain_deeper_than_eight_spawns_errors_the_label_that_would_go_deeper(
    make_app: MakeApp,
) -> None:
    app = make_app(NESTED)
    nested: list[object] = []
    for _ in range(12):
        nested = [nested]
    with running(app):
        service.create_label(app, app.config.get_machine("node"), "r", {"item": nested})
        deepest = "r" + "/0" * 8
        wait_until(
            lambda: (
                rows(app, "SELECT errored, last_error FROM labels WHERE name = %(n)s", n=deepest)
                == [
                    (
                        True,
                        "spawn split: nesting deeper than 8 spawns"
                        " (this label is a child 8 spawns deep)",
                    )
                ]
            ),
            "the label eight spawns deep errored",
        )
    assert rows(app, "SELECT max(depth), count(*) FROM children") == [(8, 8)]


def test_the_changes_stream_carries_children_like_any_label(make_app: MakeApp) -> None:
    app = make_app(config())
    item = app.config.get_machine("item")
    with running(app):
        _spawned(app, [1, 2])
        service.update_metadata(app, item, "o1/0", {"ok": True})

    def changes() -> list[tuple[str, str, str | None]]:
        """What the stream shows (once the horizon has passed the last write, on Citus)."""
        with app.db.connect() as conn:
            page = read_changes(conn, Position(0, 0), machine="item", limit=10, horizon=app.horizon)
        return [(change.label, change.kind, change.new_state) for change in page.changes]

    wait_until(
        lambda: (
            changes()
            == [
                ("o1/0", "created", "waiting"),
                ("o1/1", "created", "waiting"),
                ("o1/0", "moved", "picked"),
            ]
        ),
        changes,
    )
