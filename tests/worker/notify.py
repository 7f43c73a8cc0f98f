"""The machine most worker tests deliver with: one webhook, then a gate that never opens.

``notify_config`` writes its YAML (``{stub}`` stands for the stub server, as
``make_app`` expects); ``create`` and ``state`` handle labels in it.
"""

from __future__ import annotations

from routemaster import service
from routemaster.app import App

_MACHINE = """
state_machines:
  m:{retry}
    states:
      - action: notify
        webhook: "{{stub}}/hook/<label>"
        next: done
      - gate: done
        exit_condition: false
"""

_RECEIVER = """receivers:
  - {{match: '127\\.0\\.0\\.1', {policy}}}
"""


def notify_config(*, retry: str | None = None, receiver: str | None = None) -> str:
    """Machine ``m``: ``notify`` calls ``{stub}/hook/<label>``, then the label rests in ``done``.

    ``retry`` is the machine's retry policy and ``receiver`` the stub's receiver
    policy, each the inside of a YAML flow mapping (``max_attempts: 3, ...``).
    """
    yaml = _MACHINE.format(retry="" if retry is None else f"\n    retry: {{{retry}}}")
    return yaml if receiver is None else yaml + _RECEIVER.format(policy=receiver)


def create(app: App, *names: str) -> None:
    """Labels ``names`` in machine ``m``, with no metadata."""
    machine = app.config.get_machine("m")
    for name in names:
        service.create_label(app, machine, name, {})


def state(app: App, name: str) -> str:
    return service.get_label(app, app.config.get_machine("m"), name).state
