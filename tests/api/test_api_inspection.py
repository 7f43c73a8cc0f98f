"""Listings (streamed, paged, filtered), machine descriptions, history and explanations."""

from __future__ import annotations

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.api import labels as label_endpoints
from tests.api.helpers import body

LABELS = "/state-machines/user/labels"


def insert_labels(engine: sa.Engine, count: int, state: str = "start") -> list[str]:
    """Many labels at once, straight into the table (the API is tested elsewhere)."""
    names = [f"label-{index:05d}" for index in range(count)]
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, state, state_entered_at, entry_id,"
                " name_key, shard_key) "
                "SELECT 'user', n, :state, now(), 0, routemaster_label_key(n),"
                " routemaster_shard_key(n) FROM unnest(CAST(:names AS text[])) AS n"
            ),
            {"names": names, "state": state},
        )
    return names


def test_listing_streams_every_label_across_batches(
    client: FlaskClient, db_engine: sa.Engine
) -> None:
    count = label_endpoints.STREAM_BATCH * 2 + 7
    names = insert_labels(db_engine, count)
    response = client.get(LABELS)
    assert response.is_streamed
    assert response.status_code == 200
    assert [entry["name"] for entry in body(response)["labels"]] == names
    assert body(response)["create"] == "/state-machines/user/labels/:name"


def test_listing_of_an_exact_batch_multiple_ends_cleanly(
    client: FlaskClient, db_engine: sa.Engine
) -> None:
    names = insert_labels(db_engine, label_endpoints.STREAM_BATCH)
    assert len(body(client.get(LABELS))["labels"]) == len(names)


def test_empty_listing(client: FlaskClient) -> None:
    assert body(client.get("/state-machines/empty/labels")) == {
        "labels": [],
        "create": "/state-machines/empty/labels/:name",
    }


def test_pages_follow_next_links_to_the_end(client: FlaskClient, db_engine: sa.Engine) -> None:
    names = insert_labels(db_engine, 25)
    seen: list[str] = []
    url: str | None = f"{LABELS}?limit=10"
    pages = 0
    while url is not None:
        page = body(client.get(url))
        seen.extend(entry["name"] for entry in page["labels"])
        url = page.get("next")
        pages += 1
    assert seen == names
    assert pages == 3


def test_next_link_keeps_the_state_filter_and_encodes_the_cursor(client: FlaskClient) -> None:
    for name in ("a b/1", "a b/2", "a b/3"):
        client.post(f"{LABELS}/{name.replace('/', '%2F')}", json={"metadata": {}})
    client.post(f"{LABELS}/moved", json={"metadata": {}})
    client.patch(f"{LABELS}/moved", json={"metadata": {"ready": True}})
    first = body(client.get(f"{LABELS}?limit=2&state=start"))
    assert [entry["name"] for entry in first["labels"]] == ["a b/1", "a b/2"]
    assert first["next"] == f"{LABELS}?limit=2&after=a%20b%2F2&state=start"
    second = body(client.get(first["next"]))
    assert second["labels"] == [{"name": "a b/3", "state": "start"}]
    assert "next" not in second


def test_state_filter(client: FlaskClient) -> None:
    client.post(f"{LABELS}/stays", json={"metadata": {}})
    client.post(f"{LABELS}/moves", json={"metadata": {}})
    client.patch(f"{LABELS}/moves", json={"metadata": {"ready": True}})
    assert body(client.get(f"{LABELS}?state=review"))["labels"] == [
        {"name": "moves", "state": "review"}
    ]
    assert body(client.get(f"{LABELS}?state=start"))["labels"] == [
        {"name": "stays", "state": "start"}
    ]
    assert body(client.get(f"{LABELS}?state=nowhere"))["labels"] == []


def test_after_without_limit_streams_the_rest(client: FlaskClient, db_engine: sa.Engine) -> None:
    names = insert_labels(db_engine, 5)
    page = body(client.get(f"{LABELS}?after={names[1]}"))
    assert [entry["name"] for entry in page["labels"]] == names[2:]


def test_bad_limits_are_400(client: FlaskClient) -> None:
    for limit in ("0", "-1", "x", "1.5", "10001"):
        response = client.get(f"{LABELS}?limit={limit}")
        assert response.status_code == 400, limit
        assert body(response)["message"] == "limit must be an integer from 1 to 10000."


def test_an_empty_query_value_is_as_if_left_out(client: FlaskClient) -> None:
    client.post(f"{LABELS}/a", json={"metadata": {}})
    whole = body(client.get(LABELS))
    for query in ("limit=", "state=", "errored=", "prefix=", "after=", "where=", "count="):
        response = client.get(f"{LABELS}?{query}")
        assert response.status_code == 200, query
        assert body(response) == whole, query


def test_machine_description_counts_live_labels_per_state(client: FlaskClient) -> None:
    client.post(f"{LABELS}/a", json={"metadata": {}})
    client.post(f"{LABELS}/b", json={"metadata": {}})
    client.post(f"{LABELS}/c", json={"metadata": {}})
    client.patch(f"{LABELS}/c", json={"metadata": {"ready": True}})
    client.post(f"{LABELS}/d", json={"metadata": {}})
    client.delete(f"{LABELS}/d")
    response = client.get("/state-machines/user")
    assert response.status_code == 200
    described = body(response)
    assert described["label_counts"] == {"start": 2, "review": 1}
    counts = {state["name"]: state["labels"] for state in described["states"]}
    assert counts == {"start": 2, "review": 1, "notify": 0, "done": 0}
    assert described["labels"] == LABELS
    assert client.get("/state-machines/nope").status_code == 404


def test_history_lists_transitions_oldest_first(client: FlaskClient) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {}})
    client.patch(f"{LABELS}/alice", json={"metadata": {"ready": True, "approved": True}})
    client.delete(f"{LABELS}/alice")
    response = client.get(f"{LABELS}/alice/history")
    assert response.status_code == 200
    moves = [(entry["old_state"], entry["new_state"]) for entry in body(response)["history"]]
    assert moves == [(None, "start"), ("start", "review"), ("review", "notify"), ("notify", None)]
    assert all(entry["created"] for entry in body(response)["history"])


def test_history_of_an_unknown_label_is_404(client: FlaskClient) -> None:
    assert client.get(f"{LABELS}/nobody/history").status_code == 404


def test_explain_a_label_in_an_end_gate_goes_nowhere(client: FlaskClient) -> None:
    """null, as the document says (the checked client validates the answer against it)."""
    client.post(f"{LABELS}/ends", json={"metadata": {}})
    moved = client.post(f"{LABELS}/ends/move", json={"state": "done", "reason": "test"})
    assert moved.status_code == 200
    described = body(client.get(f"{LABELS}/ends/explain"))
    assert described["state"] == "done"
    assert described["next_state_if_held"] is None
    # finished, not waiting for metadata that could change something
    assert described["next_check_at"] is None
    assert described["message"] == (
        "An end state: the label has finished here and stays; no metadata, time or trigger "
        "moves it on, only an operator's move."
    )


def test_explain_a_gate_clause_by_clause(client: FlaskClient) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {"ready": False, "route": "fast"}})
    response = client.get(f"{LABELS}/alice/explain")
    assert response.status_code == 200
    described = body(response)
    assert described["state"] == "start"
    assert described["kind"] == "gate"
    assert described["state_entered_at"]
    assert described["exit_condition"]["source"] == "metadata.ready = true"
    assert described["exit_condition"]["result"] is False
    assert described["next_state_if_held"] == "done"
    assert described["triggers"]


def test_explain_an_action(client: FlaskClient) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {"approved": True}})
    client.patch(f"{LABELS}/alice", json={"metadata": {"ready": True}})
    described = body(client.get(f"{LABELS}/alice/explain"))
    assert described["kind"] == "action"
    assert described["state"] == "notify"
    assert described["attempts"] == 0
    assert described["errored"] is False
    assert described["due_at"] is not None


def test_explain_a_deleted_label_is_410(client: FlaskClient) -> None:
    client.post(f"{LABELS}/alice", json={"metadata": {}})
    client.delete(f"{LABELS}/alice")
    assert client.get(f"{LABELS}/alice/explain").status_code == 410


def test_explain_says_when_a_condition_holds_but_nothing_will_evaluate_it(
    client: FlaskClient,
) -> None:
    """Created with the condition already true: as in 1.x no trigger fired yet."""
    client.post(f"{LABELS}/alice", json={"metadata": {"ready": True}})
    described = body(client.get(f"{LABELS}/alice/explain"))
    assert described["state"] == "start"
    assert described["exit_condition"]["result"] is True
    assert described["due_at"] is None
    assert "holds, but no evaluation is scheduled" in described["message"]
    assert "metadata.ready" in described["message"]


def test_labels_can_be_searched_by_name_prefix(client: FlaskClient) -> None:
    for name in ("apple", "apricot", "banana", "ap"):
        client.post(f"{LABELS}/{name}", json={"metadata": {}})
    client.patch(f"{LABELS}/apricot", json={"metadata": {"ready": True}})
    found = body(client.get(f"{LABELS}?prefix=ap"))
    assert [entry["name"] for entry in found["labels"]] == ["ap", "apple", "apricot"]
    in_start = body(client.get(f"{LABELS}?prefix=ap&state=start&limit=1"))
    assert [entry["name"] for entry in in_start["labels"]] == ["ap"]
    rest = body(client.get(in_start["next"]))
    assert [entry["name"] for entry in rest["labels"]] == ["apple"]
    assert body(client.get(f"{LABELS}?prefix=%25"))["labels"] == []  # no LIKE wildcards
