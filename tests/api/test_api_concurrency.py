"""Threads hammering one label through the API: one winner for a name, no lost updates."""

from __future__ import annotations

from collections import Counter

import flask

from tests.api.helpers import body
from tests.waiting import run_together

URL = "/state-machines/user/labels/contended"


def test_twenty_concurrent_creates_give_one_201_and_the_rest_409(flask_app: flask.Flask) -> None:
    def create(index: int) -> int:
        response = flask_app.test_client().post(URL, json={"metadata": {"creator": index}})
        return response.status_code

    statuses = Counter(run_together(20, create))
    assert statuses == Counter({201: 1, 409: 19})


def test_concurrent_patches_of_different_keys_lose_nothing(flask_app: flask.Flask) -> None:
    assert flask_app.test_client().post(URL, json={"metadata": {}}).status_code == 201

    def patch(thread: int) -> int:
        client = flask_app.test_client()
        for round_ in range(10):
            response = client.patch(
                URL, json={"metadata": {"keys": {f"t{thread}-{round_}": round_}}}
            )
            assert response.status_code == 200
        return thread

    run_together(20, patch)
    keys = body(flask_app.test_client().get(URL))["metadata"]["keys"]
    assert keys == {f"t{thread}-{round_}": round_ for thread in range(20) for round_ in range(10)}
