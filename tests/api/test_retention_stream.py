"""The changes stream across retention, served by the real ``routemaster serve``.

History is written by an in-process App whose clock says "two hours ago",
pruned as a worker would (``retention: history: 1h``), then read from the
server: a client resuming from a pruned position gets one ``event: gap``,
then every kept change after it, then new ones.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from routemaster import service
from routemaster.app import App, Settings
from routemaster.config import load_config
from routemaster.db import retention as retention_store
from routemaster.service.retention import prune
from tests.api.conftest import CONFIG_PATH
from tests.serving import serving
from tests.sse import EventStream
from tests.worker.conftest import FakeClock


@pytest.fixture
def server(database_url: str, db_engine: sa.Engine) -> Iterator[str]:
    with serving(
        CONFIG_PATH,
        database_url,
        "--workers",
        "1",
        env={"ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"},
    ) as base:
        yield base


@pytest.fixture
def pruned(tmp_path: Path, db_engine: sa.Engine) -> Iterator[App]:
    """``ann`` and ``bob`` created and moved two hours ago, ``cat`` now; history pruned."""
    layer = tmp_path / "retention.yaml"
    layer.write_text("retention:\n  history: 1h\n")
    clock = FakeClock(datetime.datetime.now(datetime.UTC))
    app = App(config=load_config([CONFIG_PATH, layer]), db=db_engine, settings=Settings())
    app.clock = clock
    user = app.config.get_machine("user")
    service.create_label(app, user, "ann", {})
    service.create_label(app, user, "bob", {})
    service.update_metadata(app, user, "ann", {"ready": True, "route": "fast"})
    service.update_metadata(app, user, "bob", {"ready": True, "route": "fast"})
    clock.advance(hours=2)
    service.create_label(app, user, "cat", {})
    assert prune(app).rows["history"] == 2  # ann's and bob's creation
    yield app
    app.http.close()


@pytest.mark.parametrize("resume", ["header", "after"])
def test_a_stream_resumed_from_a_pruned_position_gets_the_gap_then_everything_after(
    server: str, pruned: App, resume: str
) -> None:
    with pruned.db.connect() as conn:
        oldest = retention_store.pruned_position(conn, None)
    path, header = "/changes", None
    if resume == "header":
        header = "1-1"  # older than anything kept
    else:
        path = "/changes?after=0-0"
    with EventStream(server, path, last_event_id=header) as stream:
        gap, *kept = stream.events(4)
        requests.post(f"{server}/state-machines/user/labels/dan", json={"metadata": {}}, timeout=10)
        new = stream.next_event()
    assert (gap.event, gap.id, gap.data) == (
        "gap",
        str(oldest),
        {"kind": "gap", "oldest": str(oldest)},
    )
    assert [(e.event, e.data["label"], e.data["new_state"]) for e in kept] == [
        (None, "ann", "done"),
        (None, "bob", "done"),
        (None, "cat", "start"),
    ]
    assert (new.event, new.data["label"]) == (None, "dan")


def test_a_stream_from_a_kept_position_has_no_gap(server: str, pruned: App) -> None:
    with pruned.db.connect() as conn:
        oldest = retention_store.pruned_position(conn, "user")
    with EventStream(server, "/state-machines/user/changes", last_event_id=str(oldest)) as stream:
        events = stream.events(3)
    assert [(e.event, e.data["label"]) for e in events] == [
        (None, "ann"),
        (None, "bob"),
        (None, "cat"),
    ]
