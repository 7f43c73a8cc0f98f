from urllib.parse import urlsplit

import pytest

from routemaster.http.urls import render_url


def test_substitutes_label_and_machine() -> None:
    url = render_url("http://h/<state_machine>/users/<label>", label="bob", state_machine="signup")
    assert url == "http://h/signup/users/bob"


@pytest.mark.parametrize(
    "label",
    ["a/b", "../../admin", "x?y=1", "x#frag", "evil.com@", "sp ace", "é", "%2F", "a&b=c"],
)
def test_a_label_never_changes_host_path_or_query(label: str) -> None:
    url = render_url("http://host:8/users/<label>/feed?v=1", label=label, state_machine="m")
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.query, parts.fragment) == (
        "http",
        "host:8",
        "v=1",
        "",
    )
    assert parts.path.startswith("/users/")
    assert parts.path.endswith("/feed")
    assert parts.path.count("/") == 3


def test_machine_name_is_encoded_too() -> None:
    assert (
        render_url("http://h/<state_machine>", label="x", state_machine="a/b") == "http://h/a%2Fb"
    )


def test_every_occurrence_is_replaced() -> None:
    assert render_url("http://h/<label>/<label>", label="a b", state_machine="m") == (
        "http://h/a%20b/a%20b"
    )
