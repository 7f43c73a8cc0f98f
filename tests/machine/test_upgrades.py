"""What a configuration changes against the last applied one, and which labels it strands."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from routemaster.config import Config, describe_machine, load_config
from routemaster.machine.upgrades import (
    plan_as_json,
    plan_as_text,
    plan_config,
    stranded_message,
)

OLD = """\
state_machines:
  order:
    states:
      - gate: pending
        triggers: [{metadata: paid}]
        exit_condition: metadata.paid
        next:
          type: context
          path: metadata.cancel
          default: notify
          destinations: [{value: true, state: cancelled}]
      - action: notify
        webhook: http://hooks/notify
        next: done
      - gate: cancelled
        exit_condition: false
        next: done
      - gate: done
        exit_condition: false
"""


def _config(tmp_path: Path, text: str, name: str = "config.yaml") -> Config:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_config([path])


def _applied(config: Config, version: int = 1) -> dict[str, tuple[int, dict[str, Any]]]:
    return {m.name: (version, describe_machine(m)) for m in config.state_machines}


NEW = """\
state_machines:
  order:
    states:
      - gate: awaiting_payment
        triggers: [{metadata: paid}, {event: entry}]
        exit_condition: metadata.paid
        next:
          type: context
          path: metadata.cancel
          default: notify
          destinations: [{value: true, state: review}]
      - action: notify
        webhook: http://hooks/notify/v2
        next: done
      - gate: review
        exit_condition: false
        next: done
      - gate: done
        exit_condition: false
    migrations:
      - rename: {from: pending, to: awaiting_payment}
      - move: {from: cancelled, to: review}
"""


def test_each_state_is_reported_with_its_change_and_labels(tmp_path: Path) -> None:
    old = _config(tmp_path, OLD, "old.yaml")
    new = _config(tmp_path, NEW)
    counts = {"order": {"pending": 3, "notify": 1, "cancelled": 2}}
    plan = plan_config(new, _applied(old, 4), counts)
    assert not plan.strands_labels
    (machine,) = plan.machines
    assert (machine.status, machine.applied_version) == ("changed", 4)
    changes = {s.name: (s.change, s.labels, s.to, s.aspects) for s in machine.states}
    assert changes == {
        "notify": ("changed", 1, None, ("webhook",)),
        "review": ("added", 0, None, ()),
        "done": ("unchanged", 0, None, ()),
        "pending": ("renamed", 3, "awaiting_payment", ()),
        "cancelled": ("moved", 2, "review", ()),
    }


def test_changed_aspects_name_condition_triggers_and_next(tmp_path: Path) -> None:
    old = _config(tmp_path, OLD, "old.yaml")
    new = _config(
        tmp_path,
        OLD.replace("exit_condition: metadata.paid", "exit_condition: true")
        .replace("triggers: [{metadata: paid}]", "triggers: [{interval: 1h}]")
        .replace(
            "        next: done\n      - gate: done", "        next: pending\n      - gate: done"
        ),
    )
    (machine,) = plan_config(new, _applied(old), {}).machines
    changed = {s.name: s.aspects for s in machine.states if s.change == "changed"}
    assert changed == {"pending": ("exit_condition", "triggers"), "cancelled": ("next",)}


def test_a_removed_state_with_labels_and_no_migration_strands_them(tmp_path: Path) -> None:
    old = _config(tmp_path, OLD, "old.yaml")
    new = _config(tmp_path, NEW.replace("      - move: {from: cancelled, to: review}\n", ""))
    plan = plan_config(new, _applied(old), {"order": {"cancelled": 2, "pending": 1}})
    assert plan.stranded == (("order", "cancelled", 2),)
    assert stranded_message(plan).startswith(
        "Labels would be stranded in states the configuration no longer has:"
        " order.cancelled (2 labels)."
    )
    assert plan_as_json(plan)["stranded"] == [
        {"state_machine": "order", "state": "cancelled", "labels": 2}
    ]
    assert "  removed cancelled: 2 labels STRANDED" in plan_as_text(plan)


def test_a_removed_state_without_labels_strands_nothing(tmp_path: Path) -> None:
    old = _config(tmp_path, OLD, "old.yaml")
    new = _config(tmp_path, NEW.replace("      - move: {from: cancelled, to: review}\n", ""))
    plan = plan_config(new, _applied(old), {"order": {"pending": 1}})
    assert not plan.strands_labels
    assert [s.change for s in plan.machines[0].states if s.name == "cancelled"] == ["removed"]


def test_labels_in_states_never_applied_count_too(tmp_path: Path) -> None:
    """Without any recorded version (a first deploy), the labels still decide."""
    new = _config(tmp_path, NEW)
    counts = {"order": {"ghost": 1, "pending": 2}, "retired": {"start": 5}}
    plan = plan_config(new, {}, counts)
    assert plan.stranded == (("order", "ghost", 1), ("retired", "start", 5))
    statuses = {m.name: m.status for m in plan.machines}
    assert statuses == {"order": "new", "retired": "removed"}
    renamed = [s for s in plan.machines[0].states if s.name == "pending"]
    assert [(s.change, s.labels) for s in renamed] == [("renamed", 2)]


def test_the_same_configuration_changes_nothing(tmp_path: Path) -> None:
    old = _config(tmp_path, OLD)
    plan = plan_config(old, _applied(old), {"order": {"pending": 1}})
    assert [m.status for m in plan.machines] == ["unchanged"]
    assert plan_as_text(plan) == ["order: unchanged (against version 1)"]
