"""Clock triggers' occurrences: the first worker to record one fires it, for the others' logs
and metrics too; occurrences that can never be computed again are forgotten."""

from __future__ import annotations

from routemaster.db import occurrences
from routemaster.service.transactions import write

record_occurrence = write(occurrences.record_occurrence)
"""Whether this call is the first, across all workers, to handle the occurrence."""

forget_occurrences = write(occurrences.forget_occurrences)
"""Occurrences before ``before`` can never be computed again: their rows only take space."""
