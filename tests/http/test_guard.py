"""Where push subscriptions may connect: the address rules and origins."""

from __future__ import annotations

import pytest

from routemaster.http.guard import AddressPolicy, is_internal, origin_of, url_problem


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "100.64.0.1",
        "224.0.0.1",
    ],
)
def test_addresses_inside_the_network(address: str) -> None:
    assert is_internal(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_addresses_on_the_internet(address: str) -> None:
    assert not is_internal(address)


def test_origins_leave_out_default_ports_and_lower_case_the_host() -> None:
    assert origin_of("https", "Example.COM", 443) == "https://example.com"
    assert origin_of("http", "example.com", 8080) == "http://example.com:8080"
    assert origin_of("http", "::1", 80) == "http://[::1]"


def test_an_allowed_origin_is_not_resolved_or_refused() -> None:
    policy = AddressPolicy(("^http://127\\.0\\.0\\.1:8080$",))
    assert url_problem("http://127.0.0.1:8080/x", policy) is None
    refused = url_problem("http://127.0.0.1:8081/x", policy)
    assert refused is not None and refused.inside_network
    assert url_problem("http://93.184.216.34/x", AddressPolicy()) is None


def test_a_catastrophic_allow_pattern_allows_nothing() -> None:
    policy = AddressPolicy(("^(a+)+$",))
    assert not policy.allows("http://" + "a" * 40 + "!")
