"""The next check: the earliest moment a gate's condition could hold, construct by construct."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from routemaster.exit_conditions import Context, compile_condition
from routemaster.exit_conditions.next_check import NextCheck, compile_timing

UTC = datetime.UTC
LONDON = ZoneInfo("Europe/London")
ENTERED = datetime.datetime(2024, 3, 1, 10, 0, tzinfo=UTC)
AFTER = datetime.datetime(2024, 3, 1, 11, 0, tzinfo=UTC)
TICK = datetime.timedelta(microseconds=1)


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


def contexts(
    metadata: Mapping[str, Any] | None = None,
    *,
    zone: datetime.tzinfo = UTC,
    entered: datetime.datetime = ENTERED,
) -> Callable[[datetime.datetime], Context]:
    """``context_at`` as the service builds it: only ``now`` differs from moment to moment."""

    def context_at(moment: datetime.datetime) -> Context:
        return Context(
            label="label-1",
            metadata=metadata or {},
            now=moment.astimezone(zone),
            entered_state=entered,
            previous_state="start",
            current_state="waiting",
        )

    return context_at


def next_check(
    source: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    after: datetime.datetime = AFTER,
    zone: datetime.tzinfo = UTC,
) -> NextCheck:
    timing = compile_timing(compile_condition(source))
    return timing.next_check(contexts(metadata, zone=zone), after)


# --- has passed ----------------------------------------------------------------------


def test_has_passed_since_entering_is_due_when_the_duration_has_passed() -> None:
    check = next_check("12h has passed since history.entered_state")
    assert check == NextCheck(
        at("2024-03-01T22:00:00Z"), "12h has passed since history.entered_state"
    )


def test_has_passed_that_already_holds_is_due_now() -> None:
    check = next_check("30m has passed since system.entered_state")
    assert check.at == AFTER


def test_has_not_passed_holds_now_and_never_again_once_passed() -> None:
    assert next_check("2h has not passed since history.entered_state").at == AFTER
    check = next_check("30m has not passed since history.entered_state")
    assert check == NextCheck(
        None, "30m has not passed since history.entered_state: waits for an update"
    )


def test_has_passed_since_a_metadata_moment_reads_it_as_iso_8601() -> None:
    check = next_check(
        "1d has passed since metadata.paid_at", {"paid_at": "2024-03-02T09:15:00+01:00"}
    )
    assert check.at == at("2024-03-03T08:15:00Z")
    naive = next_check("1d has passed since metadata.paid_at", {"paid_at": "2024-03-02T09:15:00"})
    assert naive.at == at("2024-03-03T09:15:00Z")  # no offset: UTC, as the evaluator reads it


@pytest.mark.parametrize("value", ["soon", "2024-13-01T00:00:00", 12, None, ["2024-03-02"]])
def test_has_passed_since_something_that_is_not_a_moment_never_holds(value: Any) -> None:
    check = next_check("1h has passed since metadata.paid_at", {"paid_at": value})
    assert check == NextCheck(None, "1h has passed since metadata.paid_at: waits for an update")


def test_has_not_passed_since_something_that_is_not_a_moment_always_holds() -> None:
    assert next_check("1h has not passed since metadata.paid_at", {"paid_at": "soon"}).at == AFTER


def test_a_moment_too_late_for_the_clock_is_never_reached() -> None:
    check = next_check("2d has passed since metadata.paid_at", {"paid_at": "9999-12-31T00:00:00Z"})
    assert check.at is None


# --- system.now ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        (">=", "2024-03-04T23:00:00Z"),
        (">", "2024-03-04T23:00:00.000001Z"),
        ("=", "2024-03-04T23:00:00Z"),
    ],
)
def test_system_now_against_a_moment_in_metadata(operator: str, expected: str) -> None:
    metadata = {"due": "2024-03-05T00:00:00+01:00"}
    assert next_check(f"system.now {operator} metadata.due", metadata).at == at(expected)


def test_system_now_before_a_moment_holds_until_it_and_then_never() -> None:
    metadata = {"due": "2024-03-05T00:00:00Z"}
    assert next_check("system.now < metadata.due", metadata).at == AFTER
    late = next_check("system.now < metadata.due", metadata, after=at("2024-03-05T00:00:00Z"))
    assert late == NextCheck(None, "system.now < metadata.due: waits for an update")


def test_a_moment_on_the_left_is_solved_as_well() -> None:
    check = next_check("metadata.due <= system.now", {"due": "2024-03-02T00:00:00Z"})
    assert check == NextCheck(at("2024-03-02T00:00:00Z"), "metadata.due <= system.now")


def test_system_now_in_a_list_of_moments_holds_at_the_next_one() -> None:
    metadata = {
        "slots": ["2024-03-01T10:00:00Z", "garbage", "2024-03-03T08:00:00Z", "2024-03-02T08:00:00Z"]
    }
    assert next_check("system.now is in metadata.slots", metadata).at == at("2024-03-02T08:00:00Z")


def test_system_now_against_something_that_is_not_a_moment() -> None:
    assert next_check("system.now > metadata.due", {"due": "tomorrow"}).at is None
    assert next_check("system.now /= metadata.due", {"due": "tomorrow"}).at == AFTER


# --- system.time and times of day ------------------------------------------------------


def test_system_time_after_a_time_of_day_is_utc() -> None:
    check = next_check("system.time >= 18:30")
    assert check == NextCheck(at("2024-03-01T18:30:00Z"), "system.time >= 18:30")
    assert next_check("system.time >= 18:30", after=at("2024-03-01T20:00:00Z")).at == at(
        "2024-03-01T20:00:00Z"
    )


def test_system_time_before_a_time_of_day_is_due_at_midnight() -> None:
    check = next_check("system.time < 09:00", after=at("2024-03-01T09:00:00Z"))
    assert check.at == at("2024-03-02T00:00:00Z")


def test_strict_times_of_day_switch_a_microsecond_later() -> None:
    assert next_check("system.time > 18:30").at == at("2024-03-01T18:30:00.000001Z")


def test_a_time_of_day_in_metadata_with_an_offset() -> None:
    check = next_check("system.time >= metadata.closing", {"closing": "18:30:00+01:00"})
    assert check == NextCheck(at("2024-03-01T17:30:00Z"), "system.time >= metadata.closing")


def test_a_time_of_day_window_that_is_past_today_is_due_tomorrow() -> None:
    check = next_check("system.time >= 08:00 and system.time < 09:00")
    assert check.at == at("2024-03-02T08:00:00Z")


def test_an_empty_time_of_day_window_never_holds() -> None:
    assert next_check("system.time >= 09:00 and system.time < 08:00").at is None


@pytest.mark.parametrize("value", ["25:00", "soon", 1830, "2024-03-01T18:30:00Z"])
def test_a_time_of_day_in_metadata_that_cannot_be_read(value: Any) -> None:
    assert next_check("system.time >= metadata.closing", {"closing": value}).at is None


def test_the_drip_feed_gate() -> None:
    source = (
        "metadata.ready and 12h has passed since history.entered_state and system.time >= 18:30"
    )
    check = next_check(source, {"ready": True}, after=at("2024-03-01T05:00:00Z"))
    assert check == NextCheck(
        at("2024-03-01T22:00:00Z"), "12h has passed since history.entered_state"
    )
    early = next_check(source, {"ready": True}, after=AFTER - datetime.timedelta(hours=4))
    assert early.at == at("2024-03-01T22:00:00Z")
    morning = compile_timing(compile_condition(source)).next_check(
        contexts({"ready": True}, entered=at("2024-03-01T00:00:00Z")), AFTER
    )
    assert morning == NextCheck(at("2024-03-01T18:30:00Z"), "system.time >= 18:30")
    waiting = next_check(source, {"ready": False})
    assert waiting == NextCheck(None, "metadata.ready: waits for an update")


# --- time zones and daylight saving ------------------------------------------------------
# The service evaluates with ``now`` in UTC. A clock in a zone with rules makes system.time
# that zone's wall clock; the analysis follows whatever the evaluator would see.


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # Spring forward on 31 March 2024: 18:30 BST is 17:30 UTC.
        ("2024-03-30T19:00:00Z", "2024-03-30T19:00:00Z"),
        ("2024-03-31T00:00:00Z", "2024-03-31T17:30:00Z"),
        # Fall back on 27 October 2024: 18:30 GMT is 18:30 UTC again.
        ("2024-10-26T12:00:00Z", "2024-10-26T17:30:00Z"),
        ("2024-10-26T23:30:00Z", "2024-10-27T18:30:00Z"),
    ],
)
def test_system_time_in_london_across_the_clock_changes(after: str, expected: str) -> None:
    check = next_check("system.time >= 18:30", after=at(after), zone=LONDON)
    assert check.at == at(expected)


def test_a_time_of_day_skipped_by_spring_forward_waits_for_the_next_day() -> None:
    check = next_check(
        "system.time >= 01:10 and system.time < 01:50",
        after=at("2024-03-30T19:00:00Z"),
        zone=LONDON,
    )
    assert check.at == at("2024-04-01T00:10:00Z")


def test_the_jump_of_spring_forward_is_itself_a_moment_to_check() -> None:
    check = next_check("system.time >= 01:30", after=at("2024-03-31T00:45:00Z"), zone=LONDON)
    assert check.at == at("2024-03-31T01:00:00Z")  # 00:59:59 GMT, then 02:00 BST


def test_a_time_of_day_repeated_by_fall_back_is_found_the_first_time() -> None:
    check = next_check(
        "system.time >= 01:15 and system.time < 01:45",
        after=at("2024-10-27T00:00:00Z"),
        zone=LONDON,
    )
    assert check.at == at("2024-10-27T00:15:00Z")
    again = next_check(
        "system.time >= 01:15 and system.time < 01:45",
        after=at("2024-10-27T00:45:00Z"),
        zone=LONDON,
    )
    assert again.at == at("2024-10-27T01:15:00Z")  # 01:15 GMT, the second time round


def test_has_passed_since_a_moment_in_the_clocks_zone_counts_wall_time() -> None:
    # Python subtracts two datetimes of the same zone by their wall clocks: entering at
    # 00:30 GMT on the day clocks go forward, 2h have "passed" at 02:30 BST (01:30 UTC).
    entered = datetime.datetime(2024, 3, 31, 0, 30, tzinfo=LONDON)
    timing = compile_timing(compile_condition("2h has passed since history.entered_state"))
    check = timing.next_check(contexts(zone=LONDON, entered=entered), at("2024-03-31T00:30:00Z"))
    assert check.at == at("2024-03-31T01:30:00Z")


def test_a_wall_time_skipped_by_spring_forward_is_reached_at_the_jump() -> None:
    # Entered at 00:15 GMT: 1h "passes" when the wall clock reads 01:15, which it never
    # does that night; it jumps from 01:00 GMT to 02:00 BST, at 01:00 UTC.
    entered = datetime.datetime(2024, 3, 31, 0, 15, tzinfo=LONDON)
    timing = compile_timing(compile_condition("1h has passed since history.entered_state"))
    check = timing.next_check(contexts(zone=LONDON, entered=entered), at("2024-03-31T00:15:00Z"))
    assert check.at == at("2024-03-31T01:00:00Z")


# --- and, or, not, parentheses -------------------------------------------------------


def test_or_is_due_at_the_earlier_side() -> None:
    source = "metadata.reply is defined or 2h has passed since history.entered_state"
    assert next_check(source).at == at("2024-03-01T12:00:00Z")
    assert next_check(source, {"reply": "yes"}) == NextCheck(AFTER, "the condition holds now")


def test_and_is_due_when_both_sides_hold() -> None:
    source = "1h has passed since history.entered_state and system.now >= metadata.due"
    assert next_check(source, {"due": "2024-03-02T00:00:00Z"}).at == at("2024-03-02T00:00:00Z")
    assert next_check(source, {"due": "2024-03-01T00:00:00Z"}).at == AFTER


def test_not_of_a_time_window() -> None:
    source = (
        "not (system.time >= 09:00 and system.time < 17:00)"
        " and 2h has passed since history.entered_state"
    )
    assert next_check(source).at == at("2024-03-01T17:00:00Z")


def test_a_comparison_of_a_time_clause_with_metadata() -> None:
    source = "(system.now >= metadata.due) = metadata.expected"
    metadata = {"due": "2024-03-02T00:00:00Z", "expected": True}
    assert next_check(source, metadata).at == at("2024-03-02T00:00:00Z")


def test_a_condition_without_time_holds_now_or_waits_for_an_update() -> None:
    assert next_check('metadata.status = "paid"', {"status": "paid"}).at == AFTER
    check = next_check(
        'metadata.status = "paid" and metadata.amount > 3', {"status": "paid", "amount": 1}
    )
    assert check == NextCheck(None, "metadata.amount > 3: waits for an update")


# --- feeds -------------------------------------------------------------------------


def test_a_feed_may_hold_at_any_moment() -> None:
    check = next_check("feeds.jacquard.x and metadata.ready", {"ready": True})
    assert check == NextCheck(AFTER, "feeds.jacquard.x reads a feed: may hold at any moment")


def test_a_feed_cannot_hold_when_the_rest_cannot() -> None:
    check = next_check("metadata.ready and feeds.jacquard.x", {"ready": False})
    assert check == NextCheck(None, "metadata.ready: waits for an update")


def test_a_feed_waits_for_the_time_clause_beside_it() -> None:
    check = next_check("feeds.jacquard.score > 3 and 12h has passed since history.entered_state")
    assert check == NextCheck(
        at("2024-03-01T22:00:00Z"), "12h has passed since history.entered_state"
    )


def test_a_time_clause_that_reads_a_feed_is_unknown() -> None:
    assert next_check("1h has passed since feeds.jacquard.at").at == AFTER
    assert next_check("not (system.now > feeds.jacquard.at)").at == AFTER


# --- the analysis itself -------------------------------------------------------------


def test_the_analysis_is_compiled_once_per_program() -> None:
    program = compile_condition("12h has passed since history.entered_state")
    assert compile_timing(program) is compile_timing(compile_condition(program.source))


def test_a_search_with_very_many_moments_stops_early_but_never_late() -> None:
    start = at("2024-03-01T00:00:00Z")
    slots = [(start + datetime.timedelta(minutes=minute)).isoformat() for minute in range(200)]
    source = "system.now is in metadata.slots and system.time >= 03:00"
    check = next_check(source, {"slots": slots}, after=start)
    assert check.reason == "the analysis stops here: evaluate again then"
    assert check.at is not None and start < check.at < at("2024-03-01T03:00:00Z")
