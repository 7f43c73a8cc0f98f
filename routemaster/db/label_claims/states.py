"""The (state machine, state) pairs a claim or a sweep picks labels in, as its statement takes
them: two arrays, read back as pairs with ``(state_machine, state) IN (SELECT * FROM
unnest(...))``."""

from __future__ import annotations

from collections.abc import Sequence

StateKey = tuple[str, str]
"""(state machine, state)."""

IN_STATES = """(state_machine, state) IN (SELECT * FROM unnest(CAST(%(machines)s AS text[]),
                                                          CAST(%(states)s AS text[])))"""
"""A label in one of the pairs of ``%(machines)s`` and ``%(states)s``."""


def state_arrays(pairs: Sequence[StateKey]) -> dict[str, list[str]]:
    """The parameters of :data:`IN_STATES`."""
    return {"machines": [machine for machine, _ in pairs], "states": [state for _, state in pairs]}
