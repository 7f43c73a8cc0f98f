"""Searching labels by their data: ``GET /state-machines/{sm}/labels?where=EXPR``."""

from __future__ import annotations

import datetime
from urllib.parse import quote

import sqlalchemy as sa
from flask.testing import FlaskClient

from routemaster.app import App
from routemaster.db.plumbing.database import create_engine
from routemaster.web import create_app
from tests.api.helpers import body

LABELS = "/state-machines/user/labels"


def _create(client: FlaskClient, name: str, metadata: dict[str, object]) -> None:
    assert (
        client.post(f"{LABELS}/{quote(name, safe='')}", json={"metadata": metadata}).status_code
        == 201
    )


def _names(client: FlaskClient, where: str, **query: str) -> list[str]:
    response = client.get(LABELS, query_string={"where": where, **query})
    assert response.status_code == 200, body(response)
    return [label["name"] for label in body(response)["labels"]]


def _count(client: FlaskClient, where: str, **query: str) -> int:
    response = client.get(LABELS, query_string={"where": where, "count": "true", **query})
    assert response.status_code == 200, body(response)
    return int(body(response)["count"])


def _orders(client: FlaskClient) -> None:
    _create(client, "o1", {"total": 150, "customer": {"id": "c1"}, "tags": ["vip", "eu"]})
    _create(client, "o2", {"total": 80, "customer": {"id": "c2"}, "tags": []})
    _create(client, "o3", {"total": 150.5, "customer": {"id": "c1"}, "note": None})
    _create(client, "o4", {"total": "lots", "customer": {}})
    _create(client, "o5", {})


def test_where_selects_by_metadata_with_each_operator(client: FlaskClient) -> None:
    _orders(client)
    assert _names(client, "metadata.total > 100") == ["o1", "o3"]
    assert _names(client, "metadata.total <= 100") == ["o2"]
    assert _names(client, "metadata.total = 150") == ["o1"]
    assert _names(client, "metadata.total /= 150") == ["o2", "o3", "o4", "o5"]
    assert _names(client, 'metadata.customer.id = "c1"') == ["o1", "o3"]
    assert _names(client, '"vip" is in metadata.tags') == ["o1"]
    assert _names(client, '"vip" is not in metadata.tags') == ["o2", "o3", "o4", "o5"]
    assert _names(client, '"ot" is in metadata.total') == ["o4"]  # a substring
    assert _names(client, '"id" is in metadata.customer') == ["o1", "o2", "o3"]  # a key
    assert _names(client, "metadata.tags") == ["o1"]  # truthy: a non-empty list
    assert _names(client, "not metadata.tags") == ["o2", "o3", "o4", "o5"]


def test_null_missing_paths_and_values_that_do_not_compare(client: FlaskClient) -> None:
    _orders(client)
    # a missing path and a JSON null are both null
    assert _names(client, "metadata.note = null") == ["o1", "o2", "o3", "o4", "o5"]
    assert _names(client, "metadata.note is defined") == []
    assert _names(client, "metadata.customer.id is not defined") == ["o4", "o5"]
    assert _names(client, "metadata.nothing.at.all < 5") == []
    # a string and a number are never equal or ordered, whichever way round
    assert _names(client, "metadata.total < 1000") == ["o1", "o2", "o3"]
    assert _names(client, "not (metadata.total < 1000)") == ["o4", "o5"]
    assert _names(client, "metadata.total = true") == []
    assert _names(client, 'metadata.total >= ""') == ["o4"]


def test_history_entered_state_arithmetic(client: FlaskClient, app: App) -> None:
    _orders(client)
    now = app.now()
    with app.db.begin() as conn:
        for name, hours in (("o1", 30), ("o2", 2), ("o3", 25)):
            conn.execute(
                sa.text("UPDATE labels SET state_entered_at = :at WHERE name = :name"),
                {"at": now - datetime.timedelta(hours=hours), "name": name},
            )
    assert _names(client, "1d has passed since history.entered_state") == ["o1", "o3"]
    assert _names(client, "1d6h has passed since history.entered_state") == ["o1"]
    assert _names(client, "1h has not passed since history.entered_state") == ["o4", "o5"]
    stuck = "metadata.total > 100 and 1d has passed since history.entered_state"
    assert _names(client, stuck, state="start") == ["o1", "o3"]
    assert _names(client, "history.previous_state = null") == ["o1", "o2", "o3", "o4", "o5"]
    assert _names(client, 'history.current_state = "start"') == ["o1", "o2", "o3", "o4", "o5"]


def test_where_combines_with_state_prefix_errored_and_pages(client: FlaskClient, app: App) -> None:
    _orders(client)
    client.patch(f"{LABELS}/o2", json={"metadata": {"ready": True, "route": "fast"}})  # -> done
    assert _names(client, "metadata.total > 10", state="start") == ["o1", "o3"]
    assert _names(client, "metadata.total > 10", prefix="o2") == ["o2"]
    assert _names(client, "metadata.total > 10", errored="true") == []
    with app.db.begin() as conn:
        conn.execute(sa.text("UPDATE labels SET errored = true WHERE name = 'o3'"))
    assert _names(client, "metadata.total > 10", errored="true") == ["o3"]
    first = body(client.get(LABELS, query_string={"where": "metadata.total > 10", "limit": "2"}))
    assert [label["name"] for label in first["labels"]] == ["o1", "o2"]
    second = body(client.get(first["next"]))
    assert [label["name"] for label in second["labels"]] == ["o3"]
    assert "next" not in second


def test_count_answers_over_all_matches_ignoring_paging(client: FlaskClient) -> None:
    _orders(client)
    assert _count(client, "metadata.total > 100", limit="1", after="o1") == 2
    assert _count(client, "true") == 5
    response = client.get(LABELS, query_string={"count": "true", "state": "start"})
    assert body(response) == {"count": 5}


def test_a_bad_expression_is_400_with_the_caret_message(client: FlaskClient) -> None:
    response = client.get(LABELS, query_string={"where": "metadata.a == 1"})
    assert response.status_code == 400
    message = body(response)["message"]
    assert message.splitlines() == [
        "Error on line 1: Unknown operator == (did you mean =?)",
        "metadata.a == 1",
        "           ~~",
    ]


def test_feeds_and_unparenthesised_and_or_are_refused(client: FlaskClient) -> None:
    feeds = client.get(LABELS, query_string={"where": "feeds.f.x = 1"})
    assert feeds.status_code == 400
    assert "cannot read feeds" in body(feeds)["message"]
    mixed = client.get(LABELS, query_string={"where": "metadata.a and metadata.b or metadata.c"})
    assert mixed.status_code == 400
    assert "parentheses" in body(mixed)["message"]
    clear = client.get(LABELS, query_string={"where": "metadata.a and (metadata.b or metadata.c)"})
    assert clear.status_code == 200


def test_injection_through_strings_and_paths_finds_nothing_and_harms_nothing(
    client: FlaskClient,
) -> None:
    _orders(client)
    hostile = "x'); DELETE FROM labels; --"
    _create(client, "evil", {"total": hostile})
    assert _names(client, f'metadata.total = "{hostile}"') == ["evil"]
    assert _names(client, "metadata.total = \"' OR '1'='1\"") == []
    for path in ("metadata.a'b = 1", 'metadata."a" = 1', "metadata.a;b = 1", "metadata.a--b = 1"):
        response = client.get(LABELS, query_string={"where": path})
        assert response.status_code in (200, 400)
        if response.status_code == 200:
            assert body(response)["labels"] == []
    assert _count(client, "true") == 6


def test_the_statement_timeout_is_a_json_error_not_cannot_connect(
    app: App, database_url: str
) -> None:
    with app.db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO labels (state_machine, name, metadata, state, state_entered_at,"
                " entry_id, name_key, shard_key) SELECT 'user', 'n' || i,"
                " jsonb_build_object('total', i), 'start', now(), 1,"
                " routemaster_label_key('n' || i), routemaster_shard_key('n' || i)"
                " FROM generate_series(1, 200000) AS i"
            )
        )
    hurried = App(config=app.config, db=create_engine(database_url, statement_timeout=0.001))
    try:
        client = create_app(hurried).test_client()
        where = " and ".join(f"(metadata.total /= {n})" for n in range(50))
        response = client.get(LABELS, query_string={"where": where, "count": "true"})
    finally:
        hurried.db.dispose()
    assert response.status_code == 504
    assert "statement timeout" in body(response)["message"]
