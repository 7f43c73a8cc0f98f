"""The changes streams, served by the real ``routemaster serve`` (gunicorn, our workers)."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from importlib.util import find_spec
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from werkzeug.serving import ThreadedWSGIServer, make_server

from routemaster.app import App
from routemaster.web import create_app
from routemaster.webcore.streams import HUB_KEY
from tests.api.conftest import CONFIG_PATH
from tests.api.tcp_proxy import TcpProxy
from tests.serving import serving
from tests.sse import EventStream
from tests.waiting import wait_until

LABELS = "/state-machines/user/labels"


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


def _post(base: str, name: str, machine: str = "user") -> None:
    response = requests.post(
        f"{base}/state-machines/{machine}/labels/{name}", json={"metadata": {}}, timeout=10
    )
    assert response.status_code == 201, response.text


def test_each_history_entry_is_one_event_with_what_happened(server: str) -> None:
    with EventStream(server, "/state-machines/user/changes") as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        _post(server, "ann")
        _post(server, "other", machine="empty")  # another machine: not on this stream
        requests.patch(f"{server}{LABELS}/ann", json={"metadata": {"ready": True}}, timeout=10)
        requests.post(f"{server}{LABELS}/ann/pause", json={"reason": "audit"}, timeout=10)
        requests.delete(f"{server}{LABELS}/ann", timeout=10)
        events = stream.events(4)
    assert stream.retry == 2000
    assert [
        (e.data["kind"], e.data["label"], e.data["old_state"], e.data["new_state"]) for e in events
    ] == [
        ("created", "ann", None, "start"),
        ("moved", "ann", "start", "review"),
        ("forced", "ann", "review", "review"),
        ("deleted", "ann", "review", None),
    ]
    assert {e.data["state_machine"] for e in events} == {"user"}
    assert events[2].data["forced"] is True and events[2].data["reason"] == "audit"
    assert events[0].data["forced"] is False and events[0].data["at"].startswith("20")
    ids = [e.id for e in events]
    assert all(ids) and len(set(ids)) == 4


def test_the_stream_of_everything_has_every_machine(server: str) -> None:
    with EventStream(server, "/changes") as stream:
        _post(server, "a")
        _post(server, "b", machine="empty")
        events = stream.events(2)
    assert [(e.data["state_machine"], e.data["label"]) for e in events] == [
        ("user", "a"),
        ("empty", "b"),
    ]


def test_a_stream_started_now_leaves_out_what_committed_before_while_a_transaction_is_open(
    server: str, db_engine: sa.Engine
) -> None:
    with db_engine.connect() as other, other.begin():  # as a worker's may be, any time
        other.execute(sa.text("SELECT pg_current_xact_id()"))
        _post(server, "before")
        with EventStream(server, "/changes") as stream:
            assert stream.status == 200
            other.rollback()
            _post(server, "after")
            events = stream.events(1)
    assert [e.data["label"] for e in events] == ["after"]


def test_resuming_from_an_event_id_gives_what_came_after_it(server: str) -> None:
    for name in ("a", "b", "c"):
        _post(server, name)
    with EventStream(server, "/changes?after=0-0") as stream:
        first = stream.events(3)
    assert [e.data["label"] for e in first] == ["a", "b", "c"]
    with EventStream(server, "/changes", last_event_id=first[0].id) as resumed:
        assert [e.data["label"] for e in resumed.events(2)] == ["b", "c"]
    with EventStream(server, f"/changes?after={first[1].id}") as resumed:
        assert [e.data["label"] for e in resumed.events(1)] == ["c"]


def test_idle_streams_get_keep_alive_comments(database_url: str, db_engine: sa.Engine) -> None:
    settings = {"ROUTEMASTER_STREAM_HEARTBEAT": "0.1", "ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"}
    with serving(CONFIG_PATH, database_url, "--workers", "1", env=settings) as base:
        stream = EventStream(base, "/changes")
        assert stream.next_comment() == "keep-alive"
        _post(base, "between")
        assert stream.next_event().data["label"] == "between"
        assert stream.next_comment() == "keep-alive"
        stream.close()


def test_head_answers_at_once_without_a_body(server: str) -> None:
    response = requests.head(f"{server}/changes", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert requests.get(f"{server}/", timeout=10).status_code == 200  # the worker is free


def test_bad_positions_and_unknown_machines_are_json_errors(server: str) -> None:
    with EventStream(server, "/changes", last_event_id="yesterday") as stream:
        assert stream.status == 400
        assert "position" in stream.json()["message"]
    with EventStream(server, "/changes?after=12") as stream:
        assert stream.status == 400
    with EventStream(server, "/state-machines/nope/changes") as stream:
        assert stream.status == 404
        assert "nope" in stream.json()["message"]


@pytest.mark.parametrize("threads", ["1", "2"], ids=["sync", "gthread"])
def test_open_streams_leave_the_request_workers_free(
    database_url: str, db_engine: sa.Engine, threads: str
) -> None:
    """One worker process, many more open streams than it has threads: requests still flow."""
    with (
        serving(CONFIG_PATH, database_url, "--workers", "1", "--threads", threads) as base,
        ExitStack() as streams,
    ):
        open_streams = [streams.enter_context(EventStream(base, "/changes")) for _ in range(12)]
        assert {stream.status for stream in open_streams} == {200}
        for n in range(10):
            _post(base, f"l{n}")
            assert requests.get(f"{base}{LABELS}/l{n}", timeout=5).status_code == 200
        for stream in open_streams:
            assert [e.data["label"] for e in stream.events(10)] == [f"l{n}" for n in range(10)]


def test_streams_beyond_the_limit_are_refused_and_closed_ones_free_their_place(
    database_url: str, db_engine: sa.Engine
) -> None:
    settings = {"ROUTEMASTER_MAX_STREAMS": "2", "ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"}
    with serving(CONFIG_PATH, database_url, "--workers", "1", env=settings) as base:
        first, second = EventStream(base, "/changes"), EventStream(base, "/changes")
        _post(base, "seen")
        assert first.next_event().data["label"] == "seen"  # both are attached by now
        assert second.next_event().data["label"] == "seen"
        with EventStream(base, "/changes") as refused:
            assert refused.status == 503
            assert "streams" in refused.json()["message"]
        first.close()
        second.close()
        _post(base, "nudge")  # the hub notices closed sockets when it next writes or reads
        statuses = []
        for _ in range(200):
            with EventStream(base, "/changes") as again:
                statuses.append(again.status)
                if again.status == 200:
                    break
        assert statuses[-1] == 200


def test_concurrent_writers_and_a_reconnecting_reader_see_every_change_once(
    server: str, db_engine: sa.Engine
) -> None:
    """Writers race through the API while a reader keeps dropping and resuming its stream."""
    stop = threading.Event()

    def write(worker: int) -> int:
        session, count = requests.Session(), 0
        while not stop.is_set() and count < 40:
            name = f"w{worker}-{count}"
            session.post(f"{server}{LABELS}/{name}", json={"metadata": {}}, timeout=10)
            session.patch(
                f"{server}{LABELS}/{name}", json={"metadata": {"ready": True}}, timeout=10
            )
            count += 1
        return count

    received: list[str] = []
    last: str | None = "0-0"
    with ThreadPoolExecutor(4) as pool:
        writers = [pool.submit(write, n) for n in range(4)]
        while not all(writer.done() for writer in writers):
            with EventStream(server, "/changes", last_event_id=last) as stream:
                for _ in range(random.randint(1, 25)):
                    try:
                        event = stream.next_event(timeout=1)
                    except TimeoutError:
                        break  # the writers may be done: look again
                    assert event.id is not None
                    received.append(event.id)
                    last = event.id
        stop.set()
    with db_engine.connect() as conn:
        total = conn.execute(sa.text("SELECT count(*) FROM history")).scalar_one()
    with EventStream(server, "/changes", last_event_id=last) as stream:
        received += [e.id for e in stream.events(total - len(received), timeout=30) if e.id]
    assert len(received) == len(set(received)) == total
    positions = [tuple(int(part) for part in position.split("-")) for position in received]
    assert positions == sorted(positions)


def test_under_another_wsgi_server_a_stream_is_served_by_its_thread(app: App) -> None:
    # A short heartbeat: the stream learns that its client left at its next write, so this
    # test can end the server's threads, and the hub's reads, before the fixtures empty the
    # tables (a read still running then deadlocked with their TRUNCATE).
    app.settings = dataclasses.replace(app.settings, stream_heartbeat=0.2)
    flask_app = create_app(app)
    http = make_server("127.0.0.1", 0, flask_app, threaded=True)
    assert isinstance(http, ThreadedWSGIServer)
    http.daemon_threads = False  # server_close() joins each request's thread
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{http.port}"
    try:
        with EventStream(base, "/changes?after=0-0") as stream:
            _post(base, "plain")
            assert stream.next_event().data["label"] == "plain"
    finally:
        http.shutdown()
        thread.join()
        http.server_close()  # the stream's thread too, once its heartbeat found the client gone
    hub = flask_app.extensions[HUB_KEY]
    wait_until(lambda: hub.open_streams == 0, "the hub's reader stopped with the last stream")


def test_open_streams_ride_out_a_database_outage(database_url: str, db_engine: sa.Engine) -> None:
    """The stream stays open while the database is away and goes on where it was."""
    target = sa.engine.make_url(database_url)
    proxy = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.start()
    through_proxy = target.set(host="127.0.0.1", port=proxy.port)
    settings = {"ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"}
    try:
        with (
            serving(
                CONFIG_PATH,
                through_proxy.render_as_string(hide_password=False),
                "--workers",
                "1",
                env=settings,
            ) as base,
            EventStream(base, "/changes") as stream,
        ):
            _post(base, "before")
            assert stream.next_event().data["label"] == "before"
            proxy.stop()
            down = requests.post(f"{base}{LABELS}/lost", json={"metadata": {}}, timeout=10)
            assert down.status_code == 503
            proxy.start()
            wait_until(
                lambda: requests.get(f"{base}/", timeout=10).status_code == 200,
                "the API back",
                timeout=20,
            )
            _post(base, "after")
            assert stream.next_event().data["label"] == "after"
    finally:
        proxy.stop()


def test_streams_leave_the_worker_free_with_a_1x_request_plugin_loaded(
    tmp_path: Path, database_url: str, db_engine: sa.Engine
) -> None:
    """routemaster-prometheus wraps every request (process_request_started/finished), as in 1.x:
    one request worker, 20 open streams, and ordinary requests are still answered at once."""
    assert find_spec("routemaster_prometheus"), "./scripts/test installs the published plugins"
    layer = tmp_path / "plugins.yaml"
    layer.write_text("plugins:\n  logging:\n    - class: routemaster_prometheus:PrometheusLogger\n")
    (tmp_path / "prometheus").mkdir()
    settings = {"prometheus_multiproc_dir": str(tmp_path / "prometheus")}
    with (
        serving(CONFIG_PATH, database_url, "--workers", "1", layers=[layer], env=settings) as base,
        ExitStack() as streams,
    ):
        open_streams = [streams.enter_context(EventStream(base, "/changes")) for _ in range(20)]
        assert {stream.status for stream in open_streams} == {200}
        for _ in range(5):  # a request queued behind the streams would never be answered
            assert requests.get(f"{base}/state-machines", timeout=10).status_code == 200
        _post(base, "seen")
        assert {stream.next_event().data["label"] for stream in open_streams} == {"seen"}
