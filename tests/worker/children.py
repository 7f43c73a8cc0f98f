"""Shared configuration of the child-label tests (SPEC G3)."""

from __future__ import annotations

from typing import Any

from routemaster.app import App
from routemaster.db.statements import fetch_all


def config(wait: str = "all", on_exit: str = "keep", items_machine: str = "item") -> str:
    """``order`` spawns one ``item`` per element of ``metadata.items``; an item finishes
    when its metadata says ``ok`` (succeeded) or ``bad`` (failed)."""
    return f"""
state_machines:
  order:
    states:
      - spawn: pick
        machine: {items_machine}
        for_each: metadata.items
        wait: {wait}
        on_exit: {on_exit}
        next:
          type: context
          path: children.failed
          default: partial
          destinations:
            - value: 0
              state: done
      - gate: done
        exit_condition: false
      - gate: partial
        exit_condition: false
  item:
    states:
      - gate: waiting
        exit_condition: metadata.ok = true or metadata.bad = true
        triggers:
          - metadata: ok
          - metadata: bad
        next:
          type: context
          path: metadata.ok
          default: broken
          destinations:
            - value: true
              state: picked
      - gate: picked
        exit_condition: false
        outcome: succeeded
      - gate: broken
        exit_condition: false
        outcome: failed
"""


def rows(app: App, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with app.db.connect() as conn:
        return [tuple(row) for row in fetch_all(conn, sql, params)]
