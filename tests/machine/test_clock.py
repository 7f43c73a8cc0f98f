"""The pure clock arithmetic of interval and daily-time triggers."""

import datetime
from zoneinfo import ZoneInfo

import pytest

from routemaster.app import system_zone
from routemaster.machine.clock import (
    MISSED_TIME_GRACE,
    daily_occurrence,
    due_time_occurrence,
    interval_occurrence,
)
from routemaster.machine.schedule import label_zone

UTC = datetime.UTC


def at(*args: int, tz: datetime.tzinfo = UTC) -> datetime.datetime:
    return datetime.datetime(*args, tzinfo=tz)  # type: ignore[arg-type,misc]


def test_interval_occurrences_are_aligned_to_the_epoch() -> None:
    ninety = datetime.timedelta(minutes=90)
    assert interval_occurrence(at(2024, 1, 1, 1, 29, 59), ninety) == at(2024, 1, 1, 0, 0)
    assert interval_occurrence(at(2024, 1, 1, 1, 30), ninety) == at(2024, 1, 1, 1, 30)
    second = datetime.timedelta(seconds=1)
    assert interval_occurrence(
        at(2024, 1, 1, 0, 0, 5) + datetime.timedelta(microseconds=7), second
    ) == (at(2024, 1, 1, 0, 0, 5))


def test_every_worker_computes_the_same_interval_occurrence() -> None:
    interval = datetime.timedelta(hours=1, minutes=30)
    moments = [at(2024, 3, 5, 10, 31) + datetime.timedelta(seconds=s) for s in range(0, 3000, 7)]
    assert len({interval_occurrence(moment, interval) for moment in moments}) == 1


def test_daily_occurrence_today_or_yesterday() -> None:
    half_six = datetime.time(18, 30)
    assert daily_occurrence(at(2024, 5, 2, 18, 30), half_six, UTC) == at(2024, 5, 2, 18, 30)
    assert daily_occurrence(at(2024, 5, 2, 18, 29, 59), half_six, UTC) == at(2024, 5, 1, 18, 30)


def test_daily_occurrence_in_a_named_zone() -> None:
    new_york = ZoneInfo("America/New_York")
    nine = datetime.time(9, 0)
    # 9:00 EDT is 13:00 UTC in summer, 14:00 UTC in winter.
    assert daily_occurrence(at(2024, 7, 1, 13, 0, 1), nine, new_york) == at(2024, 7, 1, 13, 0)
    assert daily_occurrence(at(2024, 1, 15, 14, 0, 1), nine, new_york) == at(2024, 1, 15, 14, 0)
    assert daily_occurrence(at(2024, 1, 15, 13, 59), nine, new_york) == at(2024, 1, 14, 14, 0)


def test_a_time_skipped_by_dst_still_happens_once_that_day() -> None:
    london = ZoneInfo("Europe/London")
    # 2024-03-31: clocks go from 01:00 to 02:00 GMT, so 01:30 local does not exist.
    occurrence = daily_occurrence(at(2024, 3, 31, 12, 0), datetime.time(1, 30), london)
    assert occurrence.date() == datetime.date(2024, 3, 31)


def test_a_time_repeated_by_dst_happens_once() -> None:
    london = ZoneInfo("Europe/London")
    # 2024-10-27: 01:30 local happens at 00:30 UTC (BST) and again at 01:30 UTC (GMT).
    half_one = datetime.time(1, 30)
    assert daily_occurrence(at(2024, 10, 27, 0, 30, 1), half_one, london) == at(2024, 10, 27, 0, 30)
    assert daily_occurrence(at(2024, 10, 27, 1, 30, 1), half_one, london) == at(2024, 10, 27, 0, 30)


def test_an_old_missed_time_is_not_fired() -> None:
    half_six = datetime.time(18, 30)
    within = at(2024, 5, 2, 18, 30) + MISSED_TIME_GRACE
    assert due_time_occurrence(within, half_six, UTC) == at(2024, 5, 2, 18, 30)
    late = within + datetime.timedelta(seconds=1)
    assert due_time_occurrence(late, half_six, UTC) is None


@pytest.mark.parametrize("name", [None, "", 3, "Not/AZone", "../etc/passwd"])
def test_invalid_label_zones_are_none(name: object) -> None:
    assert label_zone(name) is None


def test_label_zone_valid() -> None:
    assert label_zone("Asia/Tokyo") == ZoneInfo("Asia/Tokyo")


def test_system_zone_follows_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert system_zone() == ZoneInfo("Asia/Tokyo")
