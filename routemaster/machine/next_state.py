"""Choosing the next state: pure, so the API and the worker decide alike."""

from __future__ import annotations

from routemaster.config.formats import same_value
from routemaster.config.model import ConstantNext, NextStates, NoNext
from routemaster.exit_conditions import Context


def choose_next_state(next_states: NextStates, context: Context) -> str | None:
    """The state a label leaving its current state goes to; ``None`` for an end state.

    A context transition takes the first destination whose value equals the
    looked-up one (``1`` matches ``1.0``, ``true`` does not match ``1``), else
    its default. Reading a feed may raise ``FeedUnavailable``.
    """
    if isinstance(next_states, ConstantNext):
        return next_states.state
    if isinstance(next_states, NoNext):
        return None
    value = context.lookup(next_states.path)
    for destination in next_states.destinations:
        if same_value(destination.value, value):
            return destination.state
    return next_states.default
