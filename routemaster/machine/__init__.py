"""Pure state-machine planning: where a label goes, and which triggers fire.

Nothing here does I/O or reads the clock: the label's :class:`PlanInput`, the time and
a way to read feeds are passed in, so the API and the worker decide alike and
every rule is unit-tested without PostgreSQL or HTTP.
"""

from routemaster.machine.next_state import choose_next_state
from routemaster.machine.planning import Plan, PlanInput, plan_moves
from routemaster.machine.triggers import evaluates_on_entry, update_fires

__all__ = [
    "Plan",
    "PlanInput",
    "choose_next_state",
    "evaluates_on_entry",
    "plan_moves",
    "update_fires",
]
