"""Gauges of labels per machine and state (all, due, errored), counted at most every few seconds.

A scrape reads a snapshot of the counts; only a snapshot older than
``interval`` is counted again. In multiprocess mode the snapshot is a file
in the metrics directory shared by every gunicorn worker, refreshed by
whichever worker takes its lock first, so the database sees one count per
interval however many workers are scraped. Every configured state is
reported, with 0 when empty, so alert rules never meet a missing series.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from routemaster.config.model import Config
from routemaster.db.counts import StateCounts
from routemaster.db.gauges import LabelCounts, gauge_counts
from routemaster.machine.upgrades import labels_by_version

logger = logging.getLogger(__name__)

SNAPSHOT_FILE = "label-gauges.json"
_KINDS = (
    ("routemaster_labels", "Live labels in each state.", "labels"),
    ("routemaster_labels_due", "Labels whose work is due now and not yet taken (backlog).", "due"),
    ("routemaster_labels_errored", "Labels errored in an action, awaiting an operator.", "errored"),
)


class LabelGauges(Collector):
    def __init__(
        self,
        engine: sa.Engine,
        config: Config,
        *,
        interval: float,
        in_force: Mapping[str, int] | None = None,
        directory: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        # The machines whose labels keep a version, with the version this process runs.
        self._keeping = {
            machine.name: (in_force or {}).get(machine.name)
            for machine in config.state_machines
            if machine.keeps_versions
        }
        self._states = [
            (machine.name, state.name)
            for machine in config.state_machines
            for state in machine.states
        ]
        self._interval = interval
        self._path = Path(directory, SNAPSHOT_FILE) if directory else None
        self._clock = clock
        self._lock = threading.Lock()
        self._memory: tuple[float, LabelCounts] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.counts()
        if counts is None:
            return
        for name, documentation, kind in _KINDS:
            family = GaugeMetricFamily(name, documentation, labels=["state_machine", "state"])
            by_state: StateCounts = getattr(counts, kind)
            for key in sorted(set(self._states) | set(by_state)):
                family.add_metric(list(key), by_state.get(key, 0))
            yield family
        family = GaugeMetricFamily(
            "routemaster_labels_by_version",
            "Live labels of continue and abort machines per machine version they follow "
            "(those that keep none: the version in force).",
            labels=["state_machine", "version"],
        )
        for machine, version, count in self._by_version(counts):
            family.add_metric([machine, str(version)], count)
        yield family

    def _by_version(self, counts: LabelCounts) -> Iterator[tuple[str, int, int]]:
        """Each machine's labels per version they follow, by the machine page's rule; with no
        version in force, those that keep none name no version and are left out."""
        for machine, in_force in sorted(self._keeping.items()):
            total = sum(n for (name, _), n in counts.labels.items() if name == machine)
            for version, count in labels_by_version(
                in_force, total, counts.beside.get(machine, {})
            ):
                if version is not None:
                    yield machine, version, count

    def counts(self) -> LabelCounts | None:
        """The snapshot, refreshed if stale; ``None`` when there is none and no database."""
        with self._lock:
            if self._path is None:
                return self._from_memory()
            return self._from_file(self._path)

    def _from_memory(self) -> LabelCounts | None:
        if self._memory is not None and self._clock() - self._memory[0] < self._interval:
            return self._memory[1]
        fresh = self._count()
        if fresh is not None:
            self._memory = (self._clock(), fresh)
        return self._memory[1] if self._memory else None

    def _from_file(self, path: Path) -> LabelCounts | None:
        taken, counts = _read(path)
        if counts is not None and self._clock() - taken < self._interval:
            return counts
        with open(path.with_suffix(".lock"), "a") as lock:
            # Blocking only when there is nothing to show yet; else show the stale snapshot.
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if counts is None else fcntl.LOCK_NB))
            except BlockingIOError:
                return counts
            try:
                taken, counts = _read(path)  # another worker may just have refreshed it
                if counts is not None and self._clock() - taken < self._interval:
                    return counts
                fresh = self._count()
                if fresh is None:
                    return counts
                _write(path, self._clock(), fresh)
                return fresh
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _count(self) -> LabelCounts | None:
        try:
            return gauge_counts(self._engine, self._keeping)
        except sa.exc.SQLAlchemyError as error:
            logger.warning("label gauges not refreshed: %s", type(error).__name__)
            return None


def _read(path: Path) -> tuple[float, LabelCounts | None]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0.0, None
    if "beside" not in data:  # written by an older release: counted again
        return 0.0, None

    def counts(rows: list[list[Any]]) -> StateCounts:
        return {(machine, state): int(n) for machine, state, n in rows}

    return float(data["taken"]), LabelCounts(
        labels=counts(data["labels"]),
        due=counts(data["due"]),
        errored=counts(data["errored"]),
        beside=_beside(data["beside"]),
    )


def _beside(rows: list[list[Any]]) -> dict[str, dict[int, int]]:
    beside: dict[str, dict[int, int]] = {}
    for machine, version, n in rows:
        beside.setdefault(machine, {})[int(version)] = int(n)
    return beside


def _write(path: Path, taken: float, counts: LabelCounts) -> None:
    """Write to a temporary file and rename: readers never see half a snapshot."""

    def rows(by_state: StateCounts) -> list[list[Any]]:
        return [[machine, state, n] for (machine, state), n in by_state.items()]

    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(
        json.dumps(
            {
                "taken": taken,
                "labels": rows(counts.labels),
                "due": rows(counts.due),
                "errored": rows(counts.errored),
                "beside": [
                    [machine, version, n]
                    for machine, by_version in counts.beside.items()
                    for version, n in by_version.items()
                ],
            }
        )
    )
    temporary.replace(path)
