"""When an exit condition could next hold, for a label whose metadata stays as it is.

A condition's truth changes over time only through its time atoms: ``D has
(not) passed since T`` switches once, at ``T + D``; ``system.now`` compared
with a moment switches at that moment (or a microsecond later, for ``>``);
``system.time`` compared with a time of day switches daily, at that time and
at midnight. Between those breakpoints the condition is constant, so the
search evaluates the real evaluator at ``after`` and at each breakpoint, in
order, and answers the first moment where it holds. Between two one-shot
breakpoints the rest is periodic (a day), so one period of daily breakpoints
decides the whole stretch; after the last one-shot breakpoint a period where
it never holds means it never will (``at=None``).

Feeds are unknown: a clause reading one may hold at any moment, so the
condition is evaluated three-valued (true, false, unknown) and "unknown"
counts as "could hold". Everything here is pure: the clock and the label come
in through ``context_at``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from routemaster.exit_conditions.context import Context
from routemaster.exit_conditions.nodes import (
    And,
    Comparison,
    HasPassed,
    IsDefined,
    IsIn,
    Junction,
    Literal,
    Lookup,
    Node,
    Not,
)
from routemaster.exit_conditions.program import Program
from routemaster.exit_conditions.values import as_datetime, as_time, truthy

_UTC = datetime.UTC
_TICK = datetime.timedelta(microseconds=1)
_DAY = datetime.timedelta(days=1)
_MIDNIGHT = datetime.time(0, 0)
MAX_EVALUATIONS = 256
"""Evaluations one search may spend (a few suffice for most conditions; metadata with
hundreds of moments needs more); past them it answers the next unexamined moment, which
is sound: the condition held at none before it."""
_STOPPED = "the analysis stops here: evaluate again then"

ContextAt = Callable[[datetime.datetime], Context]
Moments = dict[datetime.datetime, str]  # breakpoint (UTC) -> the clause that sets it
Tri = Callable[[Context], bool | None]  # None: depends on a feed, could hold


@dataclass(frozen=True)
class NextCheck:
    """The earliest moment the condition could hold, and the clause that says so."""

    at: datetime.datetime | None  # None: cannot hold until the metadata changes
    reason: str


@dataclass(frozen=True)
class _Atom:
    """A clause whose truth depends on the clock, against one time-independent operand.

    ``kind``: ``passed`` (``duration`` has passed since ``operand``), ``now``
    (``system.now`` compared with ``operand``) or ``time`` (``system.time``
    compared with it). ``members``: the operand is a container whose items
    are compared (``system.now is in metadata.moments``).
    """

    node: Node
    text: str
    kind: str
    operand: Node
    duration: datetime.timedelta = datetime.timedelta()
    members: bool = False

    def values(self, context: Context) -> list[Any]:
        value = self.operand.evaluate(context)
        if not self.members:
            return [value]
        if isinstance(value, (list, tuple)):
            return list(value)
        return list(value) if isinstance(value, Mapping) else []


class _Clock:
    """How the evaluator's ``system.time`` reads a moment.

    In the service ``now`` is UTC, and times of day are UTC. A ``now`` carrying
    a zone with rules (a ``ZoneInfo``) makes ``system.time`` that zone's wall
    clock, which jumps at daylight-saving changes; those jumps are breakpoints.
    """

    def __init__(self, now: datetime.datetime) -> None:
        zone = now.tzinfo
        wall = zone is not None and now.timetz().utcoffset() is None
        self.zone: datetime.tzinfo | None = zone if wall else None
        self.period = _DAY if self.zone is None else 3 * _DAY

    def daily(
        self, times: Mapping[datetime.time, str], start: datetime.datetime, end: datetime.datetime
    ) -> list[tuple[datetime.datetime, str]]:
        """Moments strictly between ``start`` and ``end`` when the clock reads one of ``times``."""
        found: Moments = {}
        zone = self.zone or _UTC
        first = start.astimezone(zone).date() - _DAY
        for offset in range((end.astimezone(zone).date() - first).days + 2):
            day = first + datetime.timedelta(days=offset)
            for time, reason in times.items():
                wall = datetime.datetime.combine(day, time)
                for moment in self.instants(wall):
                    if start < moment < end:
                        found.setdefault(moment, reason)
        if self.zone is not None and times:
            reason = f"{next(iter(times.values()))} (a clock change)"
            for moment in self.transitions(start, end):
                found.setdefault(moment, reason)
        return sorted(found.items())

    def instants(self, wall: datetime.datetime) -> list[datetime.datetime]:
        """The UTC moments at which the clock reads the naive ``wall`` (two in a repeated hour)."""
        zone = self.zone or _UTC
        moments = []
        for fold in (0, 1) if self.zone is not None else (0,):
            moment = _utc(wall.replace(tzinfo=zone, fold=fold))
            if moment is not None:
                moments.append(moment)
        return moments

    def transitions(
        self, start: datetime.datetime, end: datetime.datetime
    ) -> list[datetime.datetime]:
        """The moments in ``(start, end)`` at which the zone's offset changes."""
        if self.zone is None:
            return []
        zone, found, step = self.zone, [], datetime.timedelta(hours=1)
        low = start
        while low < end:
            high = min(low + step, end)
            if low.astimezone(zone).utcoffset() != high.astimezone(zone).utcoffset():
                found.append(_first_change(zone, low, high))
            low = high
        return [moment for moment in found if start < moment < end]


class Timing:
    """The time analysis of one program, built once (see :func:`compile_timing`)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        atoms: list[_Atom] = []
        _collect(program.root, program.source, atoms)
        self._atoms = tuple(atoms)
        self._times = any(atom.kind == "time" for atom in atoms)
        self._holds: Tri = program.evaluate if not program.feeds else _tri(program.root)
        # The condition with every time of day unknown: false means no time of day helps.
        daily = frozenset(id(atom.node) for atom in atoms if atom.kind == "time")
        self._any_time: Tri = _tri(program.root, daily)
        feed_clause = _feed_clause(program.root)
        self._feed_reason = (
            ""
            if feed_clause is None
            else f"{_text(program, feed_clause)} reads a feed: may hold at any moment"
        )

    def next_check(self, context_at: ContextAt, after: datetime.datetime) -> NextCheck:
        """The earliest moment at or after ``after`` at which the condition could hold."""
        first = context_at(after)
        clock = _Clock(first.now)
        moments: Moments = {}
        times: dict[datetime.time, str] = {}
        for atom in self._atoms:
            _breakpoints(atom, first, clock, moments, times)
        if times:
            times.setdefault(_MIDNIGHT, next(iter(times.values())))
        starts = [after, *sorted(moment for moment in moments if moment > after)]
        budget = MAX_EVALUATIONS
        context = first
        for index, start in enumerate(starts):
            if budget <= 0:
                return NextCheck(start, _STOPPED)
            if index:
                context = context_at(start)
            held = self._holds(context)
            budget -= 1
            if held is not False:
                return NextCheck(start, self._reason(held, moments.get(start)))
            if not times or self._any_time(context) is False:
                continue
            end = start + clock.period
            if index + 1 < len(starts):
                end = min(end, starts[index + 1])
            for moment, reason in clock.daily(times, start, end):
                if budget <= 0:
                    return NextCheck(moment, _STOPPED)
                held = self._holds(context_at(moment))
                budget -= 1
                if held is not False:
                    return NextCheck(moment, self._reason(held, reason))
        blocking = _blocking(self.program.root, context)
        return NextCheck(None, f"{_text(self.program, blocking)}: waits for an update")

    def _reason(self, held: bool | None, clause: str | None) -> str:
        if clause is not None:
            return clause
        return self._feed_reason if held is None else "the condition holds now"


@functools.lru_cache(maxsize=1024)
def compile_timing(program: Program) -> Timing:
    """The time analysis of ``program``; cached (bounded) because it is asked per label."""
    return Timing(program)


def _breakpoints(
    atom: _Atom,
    context: Context,
    clock: _Clock,
    moments: Moments,
    times: dict[datetime.time, str],
) -> None:
    """Add the moments (and daily times) at which ``atom`` may switch, for this label."""
    for value in atom.values(context):
        if atom.kind == "time":
            time = None if isinstance(value, datetime.datetime) else as_time(value)
            if time is not None:
                times.setdefault(time, atom.text)
                later = datetime.datetime.combine(datetime.date(2000, 1, 1), time) + _TICK
                times.setdefault(later.time(), atom.text)
            continue
        moment = as_datetime(value)
        if moment is None:
            continue
        for switch in _switches(atom, moment):
            converted = _utc(switch)
            if converted is not None:
                moments.setdefault(converted, atom.text)
        if clock.zone is not None and moment.tzinfo is clock.zone:
            _wall_breakpoints(atom, moment, clock, moments)


def _wall_breakpoints(
    atom: _Atom, moment: datetime.datetime, clock: _Clock, moments: Moments
) -> None:
    """Python compares and subtracts datetimes sharing a zone by their wall clocks."""
    for each in _switches(atom, moment.replace(tzinfo=None)):
        for instant in clock.instants(each):
            moments.setdefault(instant, atom.text)
            for change in clock.transitions(instant - 2 * _DAY, instant + 2 * _DAY):
                moments.setdefault(change, f"{atom.text} (a clock change)")


def _switches(atom: _Atom, moment: datetime.datetime) -> list[datetime.datetime]:
    """Where a ``passed`` or ``now`` atom may switch: ``T + D``, or the moment and just after.

    A switch past the last representable moment is left out: no clock reaches it.
    """
    switches = []
    for step in (atom.duration,) if atom.kind == "passed" else (datetime.timedelta(), _TICK):
        with contextlib.suppress(OverflowError):
            switches.append(moment + step)
    return switches


def _collect(node: Node, source: str, atoms: list[_Atom]) -> None:
    """The time atoms under ``node`` whose truth is not decided by a feed."""
    if _reads_feeds(node) and not isinstance(node, (Junction, Not)):
        return  # unknown at every moment: nothing to solve
    text = source[node.start : node.end]
    if isinstance(node, HasPassed):
        if _constant(node.since):
            atoms.append(_Atom(node, text, "passed", node.since, duration=node.duration))
        return  # a compound ``since`` is a boolean, never a moment
    if isinstance(node, (Comparison, IsIn)):
        first, second = (
            (node.left, node.right) if isinstance(node, Comparison) else (node.item, node.container)
        )
        clock = _clock_of(first)
        if clock is not None and _constant(second):
            atoms.append(_Atom(node, text, clock, second, members=isinstance(node, IsIn)))
        elif isinstance(node, Comparison) and _constant(first):
            clock = _clock_of(second)
            if clock is not None:
                atoms.append(_Atom(node, text, clock, first))
    for child in _children(node):
        _collect(child, source, atoms)


def _tri(node: Node, opaque: frozenset[int] = frozenset()) -> Tri:
    """Three-valued truth of ``node``: ``None`` where a feed (or an ``opaque`` node, by
    ``id``) could make it either way."""
    if not _reads_feeds(node) and not _has_opaque(node, opaque):
        return lambda context: truthy(node.evaluate(context))
    if isinstance(node, Not):
        operand = _tri(node.operand, opaque)
        return lambda context: None if (value := operand(context)) is None else not value
    if isinstance(node, Junction):
        operands = tuple(_tri(operand, opaque) for operand in node.operands)
        stop_on = node.stop_on

        def junction(context: Context) -> bool | None:
            unknown = False
            for operand in operands:
                value = operand(context)
                if value is None:
                    unknown = True
                elif value is stop_on:
                    return stop_on
            return None if unknown else not stop_on

        return junction
    return lambda context: None


def _has_opaque(node: Node, opaque: frozenset[int]) -> bool:
    return id(node) in opaque or any(_has_opaque(child, opaque) for child in _children(node))


def _blocking(node: Node, context: Context) -> Node:
    """The clause that keeps a condition false for good: an ``and``'s first false operand."""
    if isinstance(node, And):
        for operand in node.operands:
            if _tri(operand)(context) is False:
                return _blocking(operand, context)
    return node


def _feed_clause(node: Node) -> Node | None:
    """The first clause (not a junction) that reads a feed."""
    if not _reads_feeds(node):
        return None
    if isinstance(node, (Junction, Not)):
        for child in _children(node):
            found = _feed_clause(child)
            if found is not None:
                return found
    return node


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Comparison):
        return (node.left, node.right)
    if isinstance(node, IsIn):
        return (node.item, node.container)
    if isinstance(node, (IsDefined, Not)):
        return (node.operand,)
    if isinstance(node, HasPassed):
        return (node.since,)
    if isinstance(node, Junction):
        return node.operands
    return ()


def _reads_feeds(node: Node) -> bool:
    if isinstance(node, Lookup):
        return node.path[0] == "feeds"
    return any(_reads_feeds(child) for child in _children(node))


def _clock_of(node: Node) -> str | None:
    """``now`` or ``time`` for the lookups that read the clock."""
    if isinstance(node, Lookup) and node.path in (("system", "now"), ("system", "time")):
        return node.path[1]
    return None


def _constant(node: Node) -> bool:
    """A value that stays as it is while the metadata does (not the clock, not a feed)."""
    if isinstance(node, Literal):
        return True
    return isinstance(node, Lookup) and _clock_of(node) is None and node.path[0] != "feeds"


def _text(program: Program, node: Node) -> str:
    return program.source[node.start : node.end]


def _utc(moment: datetime.datetime) -> datetime.datetime | None:
    """``moment`` in UTC, or None when UTC cannot represent it (no clock ever reads it)."""
    try:
        return moment.astimezone(_UTC)
    except (OverflowError, ValueError):
        return None


def _first_change(
    zone: datetime.tzinfo, low: datetime.datetime, high: datetime.datetime
) -> datetime.datetime:
    """The first moment in ``(low, high]`` with ``high``'s offset (one change between them)."""
    before = low.astimezone(zone).utcoffset()
    while high - low > _TICK:
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high
