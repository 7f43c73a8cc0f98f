"""Names of 1,024 varied 3- and 4-byte characters through every operation of the real service.

Such a name is 3-4 KiB of UTF-8 that does not compress, more than a btree
index entry holds; labels are indexed by key (``routemaster/db/keys.py``).
``routemaster serve`` and ``routemaster cron`` run as processes, and the
worker delivers to a stub webhook server on 127.0.0.1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
import requests
import sqlalchemy as sa

from routemaster.db.keys import label_key
from tests.serving import serving
from tests.sse import EventStream
from tests.stub_server import Reply, StubServer, running_stub
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

RANDOM = random.Random(1024)
FOUR_BYTES = "".join(chr(RANDOM.randint(0x10000, 0x10FFFF)) for _ in range(1024))
THREE_BYTES = "".join(chr(RANDOM.randint(0x4E00, 0x9FFF)) for _ in range(1024))
LABELS = "/state-machines/long/labels"

CONFIG = """
state_machines:
  long:
    states:
      - gate: start
        triggers:
          - metadata: go
        exit_condition: metadata.go = true
        next: hook
      - action: hook
        webhook: "{stub}/hook/<label>"
        next: waiting
      - gate: waiting
        triggers:
          - interval: 1s
        exit_condition: metadata.tick = true
        next: done
      - gate: done
        exit_condition: false
"""


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    yield from running_stub()


@pytest.fixture(scope="module")
def served(
    stub: StubServer, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    config = tmp_path_factory.mktemp("long-names") / "config.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    env = {"ROUTEMASTER_POLL_INTERVAL": "0.1", "ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.05"}
    with serving(Path(config), database_url, "--workers", "1", env=env, with_worker=True) as base:
        yield base


@pytest.fixture
def base(served: str, db_engine: sa.Engine) -> str:
    """The served API, with the tables emptied for this test."""
    return served


def url(base: str, name: str, *parts: str) -> str:
    return "/".join([f"{base}{LABELS}/{quote(name, safe='')}", *parts])


def label(session: requests.Session, base: str, name: str) -> dict[str, Any]:
    response = session.get(url(base, name), timeout=10)
    assert response.status_code == 200, response.text[:200]
    body: dict[str, Any] = response.json()
    return body


def listed(session: requests.Session, base: str, **query: str) -> list[str]:
    response = session.get(f"{base}{LABELS}", params=query, timeout=10)
    assert response.status_code == 200, response.text[:200]
    return [entry["name"] for entry in response.json()["labels"]]


def paged(session: requests.Session, base: str, **query: str) -> list[str]:
    """Every name, following ``next`` one label at a time."""
    names: list[str] = []
    response = session.get(f"{base}{LABELS}", params={"limit": "1", **query}, timeout=10)
    while True:
        body = response.json()
        names += [entry["name"] for entry in body["labels"]]
        if "next" not in body:
            return names
        response = session.get(base + body["next"], timeout=10)


def test_every_operation_works_for_names_too_long_for_a_btree_entry(
    base: str, stub: StubServer
) -> None:
    errored, paused = FOUR_BYTES, THREE_BYTES  # what each goes through, besides the common part
    others = ["a", FOUR_BYTES[:300], THREE_BYTES[:10] + "~"]
    hook = {name: "/hook/" + quote(name, safe="") for name in (errored, paused)}
    stub.script(hook[errored], Reply(410), Reply(200))
    stub.script(hook[paused], Reply(200))
    with (
        requests.Session() as session,
        EventStream(base, "/state-machines/long/changes") as stream,
    ):
        for name in (errored, paused):
            created = session.post(url(base, name), json={"metadata": {"name": name}}, timeout=10)
            assert created.status_code == 201, created.text[:200]
            assert created.json()["state"] == "start"
            again = session.post(url(base, name), json={"metadata": {}}, timeout=10)
            assert again.status_code == 409
            assert label(session, base, name)["metadata"] == {"name": name}
            patched = session.patch(url(base, name), json={"metadata": {"n": 1}}, timeout=10)
            assert patched.json()["metadata"] == {"name": name, "n": 1}
            explained = session.get(url(base, name, "explain"), timeout=10)
            assert explained.status_code == 200 and explained.json()["state"] == "start"
            page = session.get(
                f"{base}/console/machines/long/labels/{quote(name, safe='')}", timeout=10
            )
            assert page.status_code == 200 and name in page.text
        for other in others:
            assert session.post(url(base, other), json={"metadata": {}}, timeout=10).ok

        # Listings: all, by state, by prefix, and page by page.
        everything = sorted([errored, paused, *others], key=label_key)
        assert listed(session, base) == everything
        assert paged(session, base) == everything
        assert listed(session, base, state="start") == everything
        assert listed(session, base, prefix=FOUR_BYTES[:200]) == sorted(
            [FOUR_BYTES, FOUR_BYTES[:300]], key=label_key
        )
        assert paged(session, base, prefix=THREE_BYTES[:10]) == sorted(
            [THREE_BYTES, THREE_BYTES[:10] + "~"], key=label_key
        )
        search = session.get(
            f"{base}/console/machines/long/labels", params={"prefix": paused[:5]}, timeout=10
        )
        assert search.status_code == 200 and paused in search.text

        # A metadata trigger moves it into the action; the receiver says 410: errored.
        moved = session.patch(url(base, errored), json={"metadata": {"go": True}}, timeout=10)
        assert moved.json()["state"] == "hook"
        wait_until(
            lambda: label(session, base, errored)["errored"], "errored after a 410", timeout=20
        )
        assert listed(session, base, errored="true") == [errored]
        assert paged(session, base, errored="true", state="hook") == [errored]
        retried = session.post(url(base, errored, "retry"), json={}, timeout=10)
        assert retried.status_code == 200, retried.text[:200]
        wait_until(
            lambda: label(session, base, errored)["state"] == "waiting", "delivered", timeout=20
        )
        delivered = stub.received(hook[errored])
        assert len(delivered) == 2
        assert unquote(delivered[-1].path.removeprefix("/hook/")) == errored
        # The interval trigger evaluates the gate on the clock.
        session.patch(url(base, errored), json={"metadata": {"tick": True}}, timeout=10)
        assert label(session, base, errored)["state"] == "waiting"
        wait_until(
            lambda: label(session, base, errored)["state"] == "done",
            "moved by the clock",
            timeout=20,
        )

        # Paused, it is not moved; resumed, it is; then an operator moves it.
        pausing = session.post(url(base, paused, "pause"), json={"reason": paused}, timeout=10)
        assert pausing.status_code == 200 and pausing.json()["paused"] is True
        held = session.patch(url(base, paused), json={"metadata": {"go": True}}, timeout=10)
        assert held.json()["state"] == "start"
        resumed = session.post(url(base, paused, "resume"), json={}, timeout=10)
        assert resumed.status_code == 200
        wait_until(
            lambda: label(session, base, paused)["state"] == "waiting",
            "resumed, delivered",
            timeout=20,
        )
        assert unquote(stub.received(hook[paused])[-1].path.removeprefix("/hook/")) == paused
        forced = session.post(
            url(base, paused, "move"), json={"state": "done", "reason": "by hand"}, timeout=10
        )
        assert forced.status_code == 200 and forced.json()["state"] == "done"

        for name in (errored, paused):
            history = session.get(url(base, name, "history"), timeout=10).json()["history"]
            moves = [entry for entry in history if entry["kind"] in ("created", "moved")]
            assert [entry["new_state"] for entry in moves][:3] == [
                "start",
                "hook",
                "waiting",
            ]
            assert session.delete(url(base, name), timeout=10).status_code == 204
            assert session.get(url(base, name), timeout=10).status_code == 410
            history = session.get(url(base, name, "history"), timeout=10).json()["history"]
            assert history[-1]["new_state"] is None
        assert listed(session, base) == sorted(others, key=label_key)

        # The changes stream told of every step of both, under their full names.
        seen: dict[str, list[str]] = {errored: [], paused: []}
        while any("deleted" not in kinds for kinds in seen.values()):
            event = stream.next_event()
            if event.data["label"] in seen:
                seen[event.data["label"]].append(event.data["kind"])
    for kinds in seen.values():
        assert kinds[0] == "created" and kinds[-1] == "deleted" and "moved" in kinds
        assert "forced" in kinds


def test_long_names_sharing_their_first_900_characters_are_distinct_labels(base: str) -> None:
    names = [long[:900] + tail for long in (FOUR_BYTES, THREE_BYTES) for tail in ("a" * 124, "b")]
    names += [FOUR_BYTES, THREE_BYTES]
    with requests.Session() as session:
        for name in names:
            created = session.post(url(base, name), json={"metadata": {"name": name}}, timeout=10)
            assert created.status_code == 201, created.text[:200]
        for name in names:
            assert label(session, base, name)["metadata"] == {"name": name}
        assert paged(session, base) == sorted(names, key=label_key)


def test_a_short_name_equal_to_a_prefix_of_a_long_key_is_its_own_label(base: str) -> None:
    long = FOUR_BYTES  # its key: its first 1,024 bytes (256 characters), 0xFF, a hash
    shorts = [long[:256], long[:255], long[:1]]
    with requests.Session() as session:
        for name in [long, *shorts]:
            created = session.post(url(base, name), json={"metadata": {"name": name}}, timeout=10)
            assert created.status_code == 201, created.text[:200]
        for name in [long, *shorts]:
            assert label(session, base, name)["metadata"] == {"name": name}
        assert session.delete(url(base, long[:256]), timeout=10).status_code == 204
        assert label(session, base, long)["metadata"] == {"name": long}


@pytest.mark.parametrize("name", [FOUR_BYTES + "x", THREE_BYTES + "é"], ids=["4-byte", "3-byte"])
def test_1025_characters_are_still_400(base: str, name: str) -> None:
    response = requests.post(url(base, name), json={"metadata": {}}, timeout=10)
    assert response.status_code == 400
    assert "1024" in response.json()["message"]
