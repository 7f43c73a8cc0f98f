"""Property tests of the next check against the real evaluator, by brute force.

For random conditions over every time construct, random metadata (moments with offsets,
times of day, garbage), random moments near daylight-saving changes and clocks in zones
with such changes, the evaluator is run at every moment where the test itself expects a
switch (worked out here, independently of the module) and on a dense grid, over five days.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from routemaster.exit_conditions import Context, compile_condition
from routemaster.exit_conditions.next_check import compile_timing
from tests.exit_conditions.strategies import DURATIONS, time_conditions

UTC = datetime.UTC
TICK = datetime.timedelta(microseconds=1)
WINDOW = datetime.timedelta(days=5)
GRID = datetime.timedelta(minutes=15)
SETTINGS = settings(max_examples=100, deadline=None)

ZONES: list[datetime.tzinfo] = [
    UTC,
    ZoneInfo("Europe/London"),
    ZoneInfo("America/New_York"),
    ZoneInfo("Australia/Lord_Howe"),  # a 30-minute daylight-saving shift
    datetime.timezone(datetime.timedelta(hours=5, minutes=30)),
]
# Days with clock changes in those zones (2024), and an ordinary one.
DAYS = [
    "2024-03-10",
    "2024-03-31",
    "2024-04-07",
    "2024-10-06",
    "2024-10-27",
    "2024-11-03",
    "2024-06-15",
]
OFFSETS = ["Z", "+00:00", "+01:00", "-05:30", ""]
LITERAL_MOMENTS = ["2024-03-31T01:30:00+01:00"]
LITERAL_TIMES = ["18:30", "00:00", "01:30", "23:59:59", "12:00"]


@st.composite
def afters(draw: st.DrawFn) -> datetime.datetime:
    day = datetime.datetime.fromisoformat(draw(st.sampled_from(DAYS))).replace(tzinfo=UTC)
    seconds = draw(st.integers(-2 * 86400, 2 * 86400))
    return day + datetime.timedelta(
        seconds=seconds, microseconds=draw(st.sampled_from([0, 1, 500000]))
    )


def moment_texts(near: datetime.datetime) -> st.SearchStrategy[str]:
    return st.builds(
        lambda seconds, offset: _iso(near + datetime.timedelta(seconds=seconds), offset),
        st.integers(-3 * 86400, 3 * 86400).map(lambda seconds: seconds - seconds % 60),
        st.sampled_from(OFFSETS),
    )


TIMES_OF_DAY = st.sampled_from(
    ["18:30", "01:30", "02:15:00+01:00", "23:59:59.999999", "00:00", "12:00:00-05:30", "01:45"]
)
GARBAGE: st.SearchStrategy[Any] = st.sampled_from(
    ["soon", "25:00", "2024-13-01T00:00:00", 42, None, True, [], {}]
)


@st.composite
def metadata(draw: st.DrawFn, near: datetime.datetime) -> dict[str, Any]:
    moments = st.one_of(moment_texts(near), GARBAGE)
    times = st.one_of(TIMES_OF_DAY, GARBAGE)
    return {
        "m1": draw(moments),
        "m2": draw(moments),
        "junk": draw(st.one_of(GARBAGE, moment_texts(near), TIMES_OF_DAY)),
        "t1": draw(times),
        "t2": draw(times),
        "moments": draw(st.lists(moments, max_size=3)),
        "times": draw(st.lists(times, max_size=3)),
        "flag": draw(st.booleans()),
    }


def _iso(moment: datetime.datetime, offset: str) -> str:
    if offset in ("", "Z"):
        return moment.replace(tzinfo=None).isoformat() + offset
    hours, minutes = int(offset[1:3]), int(offset[4:6])
    sign = 1 if offset[0] == "+" else -1
    zone = datetime.timezone(sign * datetime.timedelta(hours=hours, minutes=minutes))
    return moment.astimezone(zone).isoformat()


class Label:
    """One label and the real evaluator: what the condition says at any moment."""

    def __init__(
        self,
        source: str,
        data: dict[str, Any],
        zone: datetime.tzinfo,
        entered: datetime.datetime,
        feed: Any,
    ) -> None:
        self.program = compile_condition(source)
        self.data = data
        self.zone = zone
        self.entered = entered
        self.feed = feed

    def context_at(self, moment: datetime.datetime) -> Context:
        return Context(
            label="label-1",
            metadata=self.data,
            now=moment.astimezone(self.zone),
            entered_state=self.entered,
            previous_state="start",
            current_state="waiting",
            fetch_feed=lambda name: self.feed,
        )

    def holds(self, moment: datetime.datetime) -> bool:
        return self.program.evaluate(self.context_at(moment))

    def samples(self, after: datetime.datetime) -> list[datetime.datetime]:
        """Every moment in the window where the test expects a switch, and a dense grid."""
        end = after + WINDOW
        found = {after + GRID * step for step in range(WINDOW // GRID + 1)}
        for moment in self._switch_moments(after, end):
            found.update((moment - TICK, moment, moment + TICK))
        return sorted(moment for moment in found if after <= moment <= end)

    def _switch_moments(
        self, after: datetime.datetime, end: datetime.datetime
    ) -> Iterator[datetime.datetime]:
        values = [*_flatten(self.data.values()), self.entered, *LITERAL_MOMENTS, *LITERAL_TIMES]
        shifts = [datetime.timedelta(minutes=minutes) for minutes in (-60, -30, 0, 30, 60)]
        durations = [_duration(text) for text in DURATIONS]
        for value in values:
            moment = _moment(value)
            if moment is not None:
                # A clock sharing the moment's zone counts wall time: off by a clock change.
                shared = moment.tzinfo is self.zone
                for duration in durations:
                    for shift in shifts if shared else shifts[2:3]:
                        yield moment + duration + shift
            time = _time(value)
            if time is not None:
                yield from _daily(time, after, end, self.zone)
        yield from _daily(datetime.time(0, 0), after, end, self.zone)
        yield from _clock_changes(self.zone, after, end)


def _flatten(values: Any) -> Iterator[Any]:
    for value in values:
        if isinstance(value, list):
            yield from _flatten(value)
        else:
            yield value


def _moment(value: Any) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime):
        return value
    try:
        moment = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _time(value: Any) -> datetime.time | None:
    try:
        time = datetime.time.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    if time.utcoffset():
        shifted = datetime.datetime.combine(datetime.date(2000, 1, 1), time.replace(tzinfo=None))
        return (shifted - time.utcoffset()).time()  # type: ignore[operator]
    return time.replace(tzinfo=None)


def _duration(text: str) -> datetime.timedelta:
    days, _, rest = text.rpartition("d")
    hours, _, rest = rest.rpartition("h")
    minutes, _, rest = rest.rpartition("m")
    seconds = rest.rstrip("s")
    parts = (int(part or 0) for part in (days, hours, minutes, seconds))
    return datetime.timedelta(
        **dict(zip(("days", "hours", "minutes", "seconds"), parts, strict=True))
    )


def _daily(
    time: datetime.time, after: datetime.datetime, end: datetime.datetime, zone: datetime.tzinfo
) -> Iterator[datetime.datetime]:
    """The moments the clock reads ``time``: in UTC, and on ``zone``'s wall clock."""
    day = after.date() - datetime.timedelta(days=2)
    while day <= end.date() + datetime.timedelta(days=1):
        wall = datetime.datetime.combine(day, time)
        yield wall.replace(tzinfo=UTC)
        for fold in (0, 1):
            yield wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        day += datetime.timedelta(days=1)


@functools.cache
def _changes(zone: datetime.tzinfo) -> tuple[datetime.datetime, ...]:
    """Every moment of 2024 at which ``zone``'s offset changes, found by a 15-minute scan."""
    found = []
    moment = datetime.datetime(2024, 1, 1, tzinfo=UTC)
    step = datetime.timedelta(minutes=15)
    while moment.year == 2024:
        if moment.astimezone(zone).utcoffset() != (moment + step).astimezone(zone).utcoffset():
            low, high = moment, moment + step
            while high - low > datetime.timedelta(seconds=1):
                middle = low + (high - low) / 2
                same = middle.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset()
                low, high = (middle, high) if same else (low, middle)
            found.append(high)
        moment += step
    return tuple(found)


def _clock_changes(
    zone: datetime.tzinfo, after: datetime.datetime, end: datetime.datetime
) -> Iterator[datetime.datetime]:
    return (moment for moment in _changes(zone) if after <= moment <= end)


def _check(label: Label, after: datetime.datetime, *, exact: bool) -> None:
    check = compile_timing(label.program).next_check(label.context_at, after)
    holding = [moment for moment in label.samples(after) if label.holds(moment)]
    if check.at is None:
        assert not holding, f"never, but holds at {holding[0]}"
        return
    assert check.at >= after
    if holding:
        assert check.at <= holding[0], f"{check} is later than {holding[0]}"
    if exact:
        assert label.holds(check.at), f"{check} does not hold then"


conditions = time_conditions()


@given(
    source=time_conditions(feeds=False),
    after=afters(),
    zone=st.sampled_from(ZONES),
    data=st.data(),
)
@SETTINGS
def test_the_next_check_is_the_first_moment_the_condition_holds(
    source: str, after: datetime.datetime, zone: datetime.tzinfo, data: st.DataObject
) -> None:
    entered = after - datetime.timedelta(seconds=data.draw(st.integers(0, 2 * 86400)))
    in_zone = data.draw(st.booleans())  # a clock and an entry sharing a zone subtract wall times
    label = Label(
        source,
        data.draw(metadata(after)),
        zone,
        entered.astimezone(zone) if in_zone else entered,
        None,
    )
    _check(label, after, exact=True)


@given(
    source=conditions,
    after=afters(),
    zone=st.sampled_from(ZONES),
    feed=st.sampled_from([None, 0, 3, True, {"x": 3, "at": "2024-03-30T00:00:00Z"}]),
    data=st.data(),
)
@SETTINGS
def test_the_next_check_is_never_later_than_the_condition_holds_whatever_the_feeds_say(
    source: str, after: datetime.datetime, zone: datetime.tzinfo, feed: Any, data: st.DataObject
) -> None:
    entered = after - datetime.timedelta(seconds=data.draw(st.integers(0, 2 * 86400)))
    label = Label(source, data.draw(metadata(after)), zone, entered, feed)
    _check(label, after, exact=not label.program.feeds)
