"""Shards moved between worker nodes under load lose and repeat nothing (SPEC F1, on Citus).

While labels are created through the API, delivered to a real webhook receiver by ``serve``'s
worker, handed to a pull worker that claims and completes them over HTTP, and a reader follows
``/changes`` (dropping and resuming its stream as it goes), a shard holding labels is moved to
the other worker node with ``citus_move_shard_placement``: once with logical replication (writes
go on during the copy), once blocking writes. Every change then arrives exactly once, in
position order and in each label's own order, and a stream resumed from a position gets exactly
the rest.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from tests.citus_cluster import Node, worker_nodes
from tests.serving import serve_process
from tests.sse import EventStream
from tests.stub_server import StubServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.citus, pytest.mark.slow, pytest.mark.timeout(300)]

CONFIG = """
state_machines:
  flow:
    states:
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: process
      - action: process
        worker: {lease: 30s}
        next: done
      - gate: done
        exit_condition: false
"""
LABELS = "/state-machines/flow/labels"
PATH = [(None, "notify"), ("notify", "process"), ("process", "done")]
"""Each label's history, in order: created into the webhook, moved to the pull action, done."""

_KEYS_BY_LABELS = sa.text(
    "SELECT shard_key, count(*) AS labels FROM labels GROUP BY shard_key ORDER BY labels DESC"
)
_SHARD_OF_KEY = sa.text("SELECT get_shard_id_for_distribution_column('labels', :key)")
_PLACEMENT = sa.text(
    "SELECT n.nodename, n.nodeport FROM pg_dist_placement AS p"
    " JOIN pg_dist_node AS n USING (groupid) WHERE p.shardid = :shard"
)
_MOVE = sa.text(
    "SELECT citus_move_shard_placement(:shard, :source_host, :source_port,"
    " :target_host, :target_port, shard_transfer_mode => CAST(:mode AS citus.shard_transfer_mode))"
)
_HISTORY_COUNT = sa.text("SELECT count(*) FROM history")
_POSITIONS = sa.text("SELECT CAST(xact_id AS text) || '-' || id FROM history")
_DONE_COUNT = sa.text("SELECT count(*) FROM labels WHERE state = 'done'")


def busiest_shards(engine: sa.Engine) -> list[int]:
    """The shards of ``labels`` that hold labels, the fullest first."""
    with engine.connect() as conn:
        keys = conn.execute(_KEYS_BY_LABELS).all()
        held: Counter[int] = Counter()
        for key, labels in keys:
            held[int(conn.execute(_SHARD_OF_KEY, {"key": key}).scalar_one())] += labels
    return [shard for shard, _ in held.most_common()]


def placement(engine: sa.Engine, shard: int) -> Node:
    with engine.connect() as conn:
        [(host, port)] = conn.execute(_PLACEMENT, {"shard": shard}).all()
    return Node(host, int(port))


def move(
    engine: sa.Engine, shard: int, target: Node, mode: str, *, conn: sa.Connection | None = None
) -> None:
    """Move ``shard`` to ``target`` and commit (in ``conn``'s transaction, if given)."""
    source = placement(engine, shard)
    with contextlib.nullcontext(conn) if conn is not None else engine.connect() as moving:
        moving.execute(
            _MOVE,
            {
                "shard": shard,
                "source_host": source.host,
                "source_port": source.port,
                "target_host": target.host,
                "target_port": target.port,
                "mode": mode,
            },
        )
        moving.commit()


class Load:
    """Creates labels and completes their pull tasks over HTTP until stopped."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.created: list[str] = []
        self.completed: list[str] = []
        self.stop_creating = threading.Event()
        self.stop_working = threading.Event()
        self.errors: list[str] = []

    def create(self) -> None:
        session = requests.Session()
        index = 0
        while not self.stop_creating.is_set():
            name = f"l{index}"
            index += 1
            answer = session.post(f"{self.base}{LABELS}/{name}", json={"metadata": {}}, timeout=30)
            if answer.status_code != 201:
                self.errors.append(f"POST {name}: {answer.status_code} {answer.text}")
                continue
            self.created.append(name)

    def work(self) -> None:
        session = requests.Session()
        while not self.stop_working.is_set():
            claim = {"worker": "mover", "limit": 10, "wait": 1}
            answer = session.post(f"{self.base}/tasks/claim", json=claim, timeout=30)
            if answer.status_code != 200:
                self.errors.append(f"claim: {answer.status_code} {answer.text}")
                continue
            for task in answer.json()["tasks"]:
                done = session.post(
                    f"{self.base}/tasks/{task['id']}/complete", json={"metadata": {}}, timeout=30
                )
                if done.status_code != 200:
                    self.errors.append(f"complete {task['label']}: {done.status_code} {done.text}")
                else:
                    self.completed.append(task["label"])


class Reader:
    """Follows ``/changes``, dropping its stream at random and resuming from its last position."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.events: list[tuple[str, str, str | None, str]] = []  # id, label, old, new
        self.stop = threading.Event()

    def read(self) -> None:
        last = "0-0"
        while not self.stop.is_set():
            with EventStream(self.base, "/changes", last_event_id=last) as stream:
                for _ in range(random.randint(1, 40)):
                    try:
                        event = stream.next_event(timeout=0.5)
                    except TimeoutError:
                        break
                    assert event.id is not None
                    data = event.data
                    self.events.append(
                        (event.id, data["label"], data["old_state"], data["new_state"])
                    )
                    last = event.id


@pytest.fixture
def served(
    tmp_path: Path, database_url: str, db_engine: sa.Engine, stub: StubServer
) -> Iterator[str]:
    config = tmp_path / "flow.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    settings = {"ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"}
    with serve_process(
        config,
        database_url,
        "--workers",
        "2",
        env=settings,
        with_worker=True,
        log=tmp_path / "serve.log",
    ) as (_, base):
        yield base


@contextmanager
def running(load: Load, reader: Reader) -> Iterator[list[Future[None]]]:
    """The creator, the pull worker and the reader in threads, all stopped when the block ends
    (however it ends); yields their futures in that order."""
    with ThreadPoolExecutor(3) as pool:
        threads = [pool.submit(load.create), pool.submit(load.work), pool.submit(reader.read)]
        try:
            yield threads
        finally:
            load.stop_creating.set()
            load.stop_working.set()
            reader.stop.set()


def position(event_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in event_id.split("-"))


def test_moving_shards_under_load_loses_and_repeats_no_change(
    served: str, database_url: str, db_engine: sa.Engine, stub: StubServer
) -> None:
    load, reader = Load(served), Reader(served)
    workers = worker_nodes(sa.engine.make_url(database_url))
    with running(load, reader) as threads:
        moved: list[tuple[int, Node]] = []
        for mode in ("force_logical", "block_writes"):
            wait_until(lambda: len(load.created) >= 30 * (len(moved) + 1), timeout=60)
            shard = next(s for s in busiest_shards(db_engine) if s not in dict(moved))
            source = placement(db_engine, shard)
            target = next(node for node in workers if node != source)
            before = len(load.created)
            move(db_engine, shard, target, mode)
            assert placement(db_engine, shard) == target
            moved.append((shard, target))
            # writes went on around the move, and go on after it
            wait_until(lambda: len(load.created) >= before + 20, timeout=60)  # noqa: B023
        load.stop_creating.set()
        threads[0].result()
        names = list(load.created)
        wait_until(
            lambda: _count(db_engine, _DONE_COUNT) == len(names),
            lambda: f"{_count(db_engine, _DONE_COUNT)} of {len(names)} labels done; {load.errors}",
            timeout=120,
        )
        total = _count(db_engine, _HISTORY_COUNT)
        assert total == len(PATH) * len(names)
        wait_until(
            lambda: len(reader.events) >= total,
            lambda: f"{len(reader.events)} of {total} changes read",
            timeout=60,
        )
    for thread in threads:
        thread.result()

    assert load.errors == []
    ids = [event[0] for event in reader.events]
    assert len(ids) == len(set(ids)) == total, _not_once(db_engine, reader.events)
    assert [position(i) for i in ids] == sorted(position(i) for i in ids), "in position order"
    by_label: dict[str, list[tuple[str | None, str]]] = defaultdict(list)
    for _, label, old, new in reader.events:
        by_label[label].append((old, new))
    assert sorted(by_label) == sorted(names)
    wrong = {label: path for label, path in by_label.items() if path != PATH}
    assert wrong == {}, "each label's changes in its own order"
    assert sorted({r.path for r in stub.received()}) == sorted(f"/hook/{n}" for n in names)
    sample = random.sample(names, 5)
    for name in sample:
        history = requests.get(f"{served}{LABELS}/{name}/history", timeout=10).json()["history"]
        assert [(e["old_state"], e["new_state"]) for e in history] == PATH

    # A stream resumed from a position gets exactly the rest, whichever shard it came from.
    for middle in (len(ids) // 3, len(ids) // 2, len(ids) - 5):
        with EventStream(served, "/changes", last_event_id=ids[middle]) as resumed:
            rest = [event.id for event in resumed.events(len(ids) - middle - 1, timeout=30)]
            assert rest == ids[middle + 1 :]
            with pytest.raises(TimeoutError):
                resumed.next_event(timeout=0.5)  # and nothing after it


def _not_once(engine: sa.Engine, events: list[tuple[str, str, str | None, str]]) -> str:
    """What "every change once" found instead: positions read twice, read but not in history,
    in history but not read, and the changes read of each label concerned."""
    with engine.connect() as conn:
        stored = set(conn.execute(_POSITIONS).scalars())
    read = Counter(event[0] for event in events)
    twice = sorted(position for position, times in read.items() if times > 1)
    unknown = sorted(set(read) - stored)
    unread = sorted(stored - set(read))
    concerned = {label for position, label, _, _ in events if position in {*twice, *unknown}}
    paths = {
        label: [(position, old, new) for position, name, old, new in events if name == label]
        for label in sorted(concerned)
    }
    return (
        f"every change once: {sum(read.values())} read, {len(stored)} in history;"
        f" read twice {twice}, read but not in history {unknown}, not read {unread};"
        f" their labels' changes as read {paths}"
    )


def _count(engine: sa.Engine, statement: sa.TextClause) -> int:
    with engine.connect() as conn:
        return int(conn.execute(statement).scalar_one())
