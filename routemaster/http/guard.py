"""Where a push subscription may send: never inside the network unless the configuration says so.

A subscription's URL is given through the API, so it could aim the workers
at the database's host, a cloud metadata service or an internal admin page.
Loopback, private, link-local (and unspecified, multicast, reserved)
addresses are refused unless the origin (``scheme://host[:port]``) matches one
of ``subscriptions: allow`` in the configuration.

Checked twice: when the subscription is stored (:func:`url_problem` resolves
the host), and on every connection the worker opens (:class:`GuardedAdapter`
checks the address the socket actually connected to, so a name that resolves
elsewhere by the time of sending, DNS rebinding included, gains nothing).
Redirects are never followed (:func:`routemaster.http.client.send`).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import regex
from urllib3.connectionpool import HTTPConnectionPool

from routemaster.http.client import BoundedAdapter

SEARCH_SECONDS = 0.1
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class UrlProblem:
    message: str
    inside_network: bool  # the address is refused (else the URL itself is unusable)


class ForbiddenAddress(OSError):
    """A connection reached an address inside the network that the configuration does not allow."""


@dataclass(frozen=True)
class AddressPolicy:
    """The ``subscriptions: allow`` patterns, searched in a URL's origin."""

    allow: tuple[str, ...] = ()

    def allows(self, origin: str) -> bool:
        for pattern in self.allow:
            try:
                if regex.search(pattern, origin, timeout=SEARCH_SECONDS) is not None:
                    return True
            except TimeoutError:
                continue
        return False


def origin_of(scheme: str, host: str, port: int | None) -> str:
    """``scheme://host[:port]``, the port left out when it is the scheme's default."""
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{shown.lower()}"
    return f"{scheme}://{shown.lower()}:{port}"


def is_internal(address: str) -> bool:
    """Loopback, private, link-local, unspecified, multicast or reserved."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_unspecified
        or ip.is_multicast
        or ip.is_reserved
        or not ip.is_global
    )


def url_problem(url: str, policy: AddressPolicy) -> UrlProblem | None:
    """Why a subscription may not send to ``url`` (scheme, shape, address); ``None`` if it may."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return UrlProblem(f"not a usable URL: {error}", False)
    if parts.scheme not in _DEFAULT_PORTS:
        return UrlProblem("the URL must start with http:// or https://", False)
    host = parts.hostname
    if not host:
        return UrlProblem("the URL has no host", False)
    if parts.username is not None or parts.password is not None:
        return UrlProblem("the URL must not carry a user name or password", False)
    origin = origin_of(parts.scheme, host, port)
    if policy.allows(origin):
        return None
    try:
        found = socket.getaddrinfo(
            host, port or _DEFAULT_PORTS[parts.scheme], type=socket.SOCK_STREAM
        )
    except (OSError, UnicodeError) as error:
        return UrlProblem(f"the host {host!r} could not be resolved: {error}", False)
    for address in sorted({str(info[4][0]) for info in found}):
        if is_internal(address):
            return UrlProblem(
                f"{origin} resolves to {address}, an address inside the network "
                "(loopback, private or link-local); the configuration's subscriptions: allow "
                "must name it to send there",
                True,
            )
    return None


def check_peer(
    sock: socket.socket, scheme: str, host: str, port: int | None, policy: AddressPolicy
) -> None:
    """Raise :class:`ForbiddenAddress` when ``sock`` is connected inside the network, unallowed."""
    address = str(sock.getpeername()[0])
    if is_internal(address) and not policy.allows(origin_of(scheme, host, port)):
        sock.close()
        raise ForbiddenAddress(
            f"{host} is at {address}, inside the network, and subscriptions: allow does not name "
            f"{origin_of(scheme, host, port)}"
        )


class GuardedAdapter(BoundedAdapter):
    """A bounded adapter whose every new connection is checked against an :class:`AddressPolicy`."""

    def __init__(self, policy: AddressPolicy, *args: Any, **kwargs: Any) -> None:
        self.policy = policy
        super().__init__(*args, **kwargs)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        classes = self.poolmanager.pool_classes_by_scheme
        guarded: dict[str, type[HTTPConnectionPool]] = {}
        for scheme, pool in classes.items():
            connection = pool.ConnectionCls
            state = {"guard_policy": self.policy, "guard_scheme": scheme}
            checked = type(f"Guarded{connection.__name__}", (_GuardedConnection, connection), state)
            guarded[scheme] = type(f"Guarded{pool.__name__}", (pool,), {"ConnectionCls": checked})
        self.poolmanager.pool_classes_by_scheme = guarded


class _GuardedConnection:
    """Mixed into urllib3's connections: the socket is checked as soon as it is connected."""

    guard_policy: AddressPolicy
    guard_scheme: str
    host: str
    port: int

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        check_peer(sock, self.guard_scheme, self.host, self.port, self.guard_policy)
        return sock
