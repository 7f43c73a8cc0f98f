"""On Citus an idle worker reads no shard, and still takes work as it comes (SPEC G1).

A ``cron`` with nothing due used to read every shard each round (a third of a core
on two workers); now its claims go quiet once they found nothing
(:mod:`routemaster.db.idle_shards`). These tests watch the scans of the ``labels``
shards on the worker nodes (``pg_stat_user_tables``) while a worker process idles,
then give it work the three ways work comes: a label due now (``NOTIFY``), a label
due a few seconds later written by another process (``routemaster_due_later``),
and a label on a shard moved to the other node since the worker went quiet.
Skipped unless ``ROUTEMASTER_TEST_CITUS_URL`` names a coordinator.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest

from routemaster import service
from routemaster.app import App
from routemaster.config import load_config
from routemaster.db.keys import shard_key
from tests.api.test_shard_move_citus import move
from tests.citus_cluster import Cluster
from tests.stub_server import Reply, StubServer
from tests.waiting import wait_until
from tests.worker.conftest import Workers
from tests.worker.notify import notify_config

pytestmark = pytest.mark.citus

TIMER = """
  t:
    states:
      - gate: wait
        triggers: [{event: timer}]
        exit_condition: system.now >= metadata.send_at
        next: done
      - gate: done
        exit_condition: false
"""

# Citus hides the shards from catalogue reads on the workers unless told otherwise.
_SCANS = (
    "SET citus.override_table_visibility TO off;"
    " SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0)::bigint FROM pg_stat_user_tables"
    " WHERE starts_with(relname, 'labels_')"
)
_SHARD_OF_KEY = "SELECT get_shard_id_for_distribution_column('labels', %s)"

QUIET_FOR = 8.0  # seconds without a scan of a labels shard on any worker node


def scans(cluster: Cluster) -> int:
    return sum(int(cluster.query(node, _SCANS)[0][0]) for node in cluster.workers)


def quiet_for(cluster: Cluster, seconds: float) -> bool:
    """Whether no worker node scanned a ``labels`` shard for ``seconds`` (read after them)."""
    before = scans(cluster)
    time.sleep(seconds)
    return scans(cluster) == before


def idle_worker(cluster: Cluster, stub: StubServer, tmp_path: Path) -> tuple[Workers, App]:
    """One worker process on the cluster, started, hearing ``NOTIFY``, and quiet."""
    path = tmp_path / "config.yaml"
    path.write_text(notify_config().replace("{stub}", stub.url("")) + TIMER)
    app = App(config=load_config([path]), db=cluster.engine)
    workers = Workers(cluster.url, path, tmp_path)
    workers.start()
    try:
        workers.wait_started(timeout=120)
        wait_until(lambda: "notifications arrive" in "".join(workers.logs()), workers.logs)
        wait_until(lambda: quiet_for(cluster, QUIET_FOR), workers.logs, timeout=90)
    except BaseException:
        workers.stop_all()
        raise
    return workers, app


def test_an_idle_worker_reads_no_shard_and_takes_work_due_now_and_later_on_time(
    citus_cluster: Cluster, stub: StubServer, tmp_path: Path
) -> None:
    workers, app = idle_worker(citus_cluster, stub, tmp_path)
    try:
        stub.script("/hook/now", Reply(200))
        service.create_label(app, app.config.get_machine("m"), "now", {})
        machine = app.config.get_machine("m")
        wait_until(
            lambda: service.get_label(app, machine, "now").state == "done",
            workers.logs,
            timeout=10,
        )

        wait_until(lambda: quiet_for(citus_cluster, QUIET_FOR), workers.logs, timeout=90)
        send_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=4)
        timer = app.config.get_machine("t")
        service.create_label(app, timer, "later", {"send_at": send_at.isoformat()})
        wait_until(
            lambda: service.get_label(app, timer, "later").state == "done",
            workers.logs,
            timeout=30,
        )
        late = datetime.datetime.now(datetime.UTC) - send_at
        assert late < datetime.timedelta(seconds=2.5), late  # within about a second of its time
    finally:
        workers.stop_all()
    assert not any("Traceback" in log for log in workers.logs())


def test_a_quiet_worker_takes_a_label_on_a_shard_moved_since(
    citus_cluster: Cluster, stub: StubServer, tmp_path: Path
) -> None:
    workers, app = idle_worker(citus_cluster, stub, tmp_path)
    try:
        name = citus_cluster.names_on(citus_cluster.workers[0], "moved", 1)[0]
        [(shard,)] = citus_cluster.query(citus_cluster.coordinator, _SHARD_OF_KEY, shard_key(name))
        move(citus_cluster.engine, int(shard), citus_cluster.workers[1], "block_writes")
        try:
            assert citus_cluster.worker_of(name) == citus_cluster.workers[1]
            stub.script(f"/hook/{name}", Reply(200))
            service.create_label(app, app.config.get_machine("m"), name, {})
            wait_until(
                lambda: service.get_label(app, app.config.get_machine("m"), name).state == "done",
                workers.logs,
                timeout=15,
            )
        finally:
            move(citus_cluster.engine, int(shard), citus_cluster.workers[0], "block_writes")
        assert [request.path for request in stub.received()] == [f"/hook/{name}"]
    finally:
        workers.stop_all()
    assert not any("Traceback" in log for log in workers.logs())
