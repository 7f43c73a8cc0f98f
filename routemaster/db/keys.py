"""Label keys: what the indexes hold for a label name, so a name of any length can be a label.

A btree index entry holds at most 2,704 bytes, and a 1,024-character name
of varied 3- or 4-byte characters is 3-4 KiB that does not compress. So the
labels' indexes hold ``name_key`` (migration 0006), which PostgreSQL computes
with ``routemaster_label_key(name)``; this module computes the same bytes for
the statements' parameters, so lookups compare a stored column with a
constant and no function runs while PostgreSQL plans them.

A name of at most :data:`WHOLE` bytes of UTF-8 is its own key. A longer one
is its first :data:`WHOLE` bytes, ``0xFF`` (never in UTF-8) and the SHA-256
of the whole name: longer than every short key, so no short name can share
it. Statements still compare the full name as well as the key.

Keys sort as their bytes, and UTF-8's byte order is code-point order, so
listings by key are by name in code-point order, except that long names
sharing their first :data:`WHOLE` bytes sort among themselves by hash.

Every row that belongs to a label also carries the label's :func:`shard_key`
(migration 0017): the column Citus distributes by, so that a label's rows in
every table live on one shard and a statement naming the label and its key
runs there alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

WHOLE = 1024
"""The most bytes of UTF-8 a key keeps as they are (migration 0006 has the same number)."""

SHARD_KEYS = 4096
"""How many shard keys there are: buckets of labels that always stay together."""

_LONG_MARK = b"\xff"
_DIGEST_SIZE = 32


def label_key(name: str) -> bytes:
    """``routemaster_label_key(name)``, computed here."""
    data = name.encode()
    if len(data) <= WHOLE:
        return data
    return data[:WHOLE] + _LONG_MARK + hashlib.sha256(data).digest()


def shard_key(name: str) -> int:
    """``routemaster_shard_key(name)``: the label's bucket, in [0, :data:`SHARD_KEYS`).

    The first two bytes of the SHA-256 of the UTF-8 name, big-endian, modulo
    :data:`SHARD_KEYS`. A bucket rather than the whole hash: a claim can then
    name the few buckets of one shard (``shard_key = ANY(...)``) and Citus
    routes it to that shard.
    """
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:2], "big") % SHARD_KEYS


def shard_keys(names: Iterable[str]) -> list[int]:
    return [shard_key(name) for name in names]


def label_keys(names: list[str]) -> list[bytes]:
    return [label_key(name) for name in names]


def label_key_arrays(labels: Iterable[tuple[str, str]]) -> dict[str, list[Any]]:
    """Labels, (machine, name) each, as the arrays statements unnest.

    ``machines``, ``names``, their ``keys`` and ``shard_keys``, in the order given.
    """
    machines: list[str] = []
    names: list[str] = []
    for machine, name in labels:
        machines.append(machine)
        names.append(name)
    return {
        "machines": machines,
        "names": names,
        "keys": label_keys(names),
        "shard_keys": shard_keys(names),
    }


def prefix_bounds(prefix: str) -> tuple[bytes, bytes]:
    """The least and greatest key a name starting with ``prefix`` can have (both inclusive).

    Every key between them starts with the prefix's first :data:`WHOLE`
    bytes, so a listing by prefix is one index range (names longer than that
    still need ``starts_with``).
    """
    lower = prefix.encode()[:WHOLE]
    return lower, lower + _LONG_MARK * (1 + _DIGEST_SIZE)
