"""Flow keys (SPEC G2): the per-key cap holds across workers; keys are served in turn by
weight; a newcomer waits at most a couple of rounds; one key alone drains at full speed."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from flask.testing import FlaskClient

from routemaster import service
from routemaster.app import App
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, WorkersFor, running
from tests.worker.flow_receiver import FlowReceiver, flow_receiver
from tests.worker.test_delivery_log import client_of


def flow_config(url: str, flow: str | None, *, receiver: str = "max_in_flight: 4") -> str:
    flow_yaml = f"\n        flow: {{{flow}}}" if flow is not None else ""
    return f"""
state_machines:
  m:
    states:
      - action: notify
        webhook: "{url}/hook/<label>"{flow_yaml}
        next: done
      - gate: done
        exit_condition: false
receivers:
  - {{match: '127\\.0\\.0\\.1', {receiver}}}
"""


def _create(app: App, labels: Sequence[tuple[str, Any]]) -> None:
    machine = app.config.get_machine("m")
    for name, metadata in labels:
        service.create_label(app, machine, name, metadata)


def _done(app: App, names: list[str]) -> bool:
    machine = app.config.get_machine("m")
    return all(service.get_label(app, machine, name).state == "done" for name in names)


def test_the_cap_holds_across_two_worker_processes(workers_for: WorkersFor) -> None:
    with flow_receiver(delay=0.05) as receiver:
        config = flow_config(
            receiver.url(), "key: metadata.customer, concurrency: 2", receiver="max_in_flight: 12"
        )
        workers, app = workers_for(config)
        labels = [(f"c{c}-{i:03}", {"customer": f"c{c}"}) for c in range(3) for i in range(40)]
        _create(app, labels)
        workers.start(delivery_concurrency=8)
        workers.start(delivery_concurrency=8)
        wait_until(lambda: _done(app, [n for n, _ in labels]), "all delivered", timeout=60)
    assert len(receiver.started) == len(labels)  # each once
    assert max(receiver.most.values()) == 2  # the cap reached, never passed
    assert receiver.most_total <= 6


def test_weights_three_to_one_share_the_calls(make_app: MakeApp) -> None:
    with flow_receiver(delay=0.02) as receiver:
        config = flow_config(
            receiver.url(),
            "key: metadata.customer, weight: metadata.weight",
            receiver="max_in_flight: 4",
        )
        app = make_app(config, delivery_concurrency=4)
        heavy = [(f"h{i:03}", {"customer": "heavy", "weight": 3}) for i in range(300)]
        light = [(f"l{i:03}", {"customer": "light", "weight": 1}) for i in range(300)]
        _create(app, heavy + light)
        with running(app):
            wait_until(lambda: len(receiver.started) >= 200, "200 calls", timeout=60)
        window = receiver.keys_in_order()[:200]
    shares = Counter(window)
    assert abs(shares["heavy"] / 200 - 0.75) <= 0.05, shares


def test_a_newcomer_waits_at_most_a_couple_of_rounds(make_app: MakeApp) -> None:
    with flow_receiver(delay=0.02) as receiver:
        config = flow_config(receiver.url(), "key: metadata.customer", receiver="max_in_flight: 4")
        app = make_app(config, delivery_concurrency=4)
        _create(app, [(f"b{i:03}", {"customer": "big"}) for i in range(400)])
        with running(app):
            wait_until(lambda: len(receiver.started) >= 40, "the burst under way", timeout=30)
            _create(app, [("newcomer", {"customer": "small"})])
            before = len(receiver.started)
            wait_until(
                lambda: any(label == "newcomer" for _, _, label in receiver.started),
                "the newcomer called",
                timeout=30,
            )
            with receiver.lock:
                order = [label for _, _, label in sorted(receiver.started)]
    # calls started after it was created and before its own: at most two rounds of 4 slots
    assert order.index("newcomer") - before <= 8


def _drain_seconds(app: App, receiver: FlowReceiver, count: int, prefix: str) -> float:
    labels = [(f"{prefix}{i:04}", {"customer": "only"}) for i in range(count)]
    _create(app, labels)
    start = time.monotonic()
    with running(app):
        wait_until(lambda: len(receiver.started) >= count, "drained", timeout=120)
    return time.monotonic() - start


def test_one_key_drains_as_fast_as_without_a_flow(make_app: MakeApp) -> None:
    with flow_receiver(delay=0.02) as receiver:
        plain = _drain_seconds(
            make_app(flow_config(receiver.url(), None), delivery_concurrency=4), receiver, 300, "p"
        )
    with flow_receiver(delay=0.02) as receiver:
        config = flow_config(receiver.url(), "key: metadata.customer, concurrency: 4")
        app = make_app(config, delivery_concurrency=4)
        flowed = _drain_seconds(app, receiver, 300, "f")
    print(f"drain of 300: plain {plain:.2f} s, one flow key {flowed:.2f} s")
    assert flowed <= plain * 1.25 + 0.5, (plain, flowed)


SHARED = """
state_machines:
  m:
    states:
      - action: notify
        webhook: "{url}/hook/<label>"
        flow: {{key: metadata.customer, concurrency: 2, name: shared}}
        next: done
      - gate: done
        exit_condition: false
  p:
    states:
      - action: pack
        worker: {{lease: 30s}}
        flow: {{key: metadata.customer, concurrency: 2, name: shared}}
        next: packed
      - gate: packed
        exit_condition: false
receivers:
  - {{match: '127\\.0\\.0\\.1', max_in_flight: 12}}
"""


def _pull(client: FlaskClient, receiver: FlowReceiver, stop: threading.Event) -> None:
    """A pull worker: claims up to 4 tasks, works on them 50 ms (counted as in flight per
    key with the receiver's calls), completes them."""
    while not stop.is_set():
        response = client.post(
            "/tasks/claim", json={"worker": "pw", "state_machine": "p", "limit": 4}
        )
        tasks = response.get_json()["tasks"]
        if not tasks:
            time.sleep(0.02)
            continue
        keys = [task["metadata"]["customer"] for task in tasks]
        with receiver.lock:
            for key in keys:
                receiver.in_flight[key] += 1
                receiver.most[key] = max(receiver.most[key], receiver.in_flight[key])
        time.sleep(0.05)
        with receiver.lock:
            for key in keys:
                receiver.in_flight[key] -= 1
        for task in tasks:
            assert client.post(f"/tasks/{task['id']}/complete", json={}).status_code == 200


def test_the_cap_holds_across_two_crons_and_a_pull_worker(workers_for: WorkersFor) -> None:
    """One flow named by a webhook action and a pull action: per key, calls in flight and
    tasks being worked on together never pass the cap."""
    with flow_receiver(delay=0.05) as receiver:
        workers, app = workers_for(SHARED.format(url=receiver.url()))
        pushed = [(f"c{c}-{i:03}", {"customer": f"c{c}"}) for c in range(3) for i in range(30)]
        _create(app, pushed)
        pulled = [(f"c{c}-{i:03}", {"customer": f"c{c}"}) for c in range(3) for i in range(30)]
        for name, metadata in pulled:
            service.create_label(app, app.config.get_machine("p"), name, metadata)
        client = client_of(app)
        stop = threading.Event()
        puller = threading.Thread(target=_pull, args=(client, receiver, stop), daemon=True)
        workers.start(delivery_concurrency=8)
        workers.start(delivery_concurrency=8)
        puller.start()
        try:
            wait_until(lambda: _done(app, [n for n, _ in pushed]), "pushed delivered", timeout=60)
            machine = app.config.get_machine("p")
            wait_until(
                lambda: all(
                    service.get_label(app, machine, name).state == "packed" for name, _ in pulled
                ),
                "pulled completed",
                timeout=60,
            )
        finally:
            stop.set()
            puller.join(timeout=10)
    assert len(receiver.started) == len(pushed)
    assert max(receiver.most.values()) == 2
