"""Token secrets: made here, shown once, stored only as a hash.

A secret reads ``rm_<key id>_<random>``. The key id (16 hex digits) is not
secret: it finds the token's row, so the check is one dictionary lookup and
one constant-time comparison of hashes, never a comparison that stops at the
first differing character. The random part has 256 bits, so a plain SHA-256
is a safe hash (no password-style stretching is needed for it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

READ = "read"  # every GET
WRITE = "write"  # create, update, delete labels
OPERATE = "operate"  # retry, pause, resume, move
WORK = "work"  # claim tasks of pull actions (POST /tasks/claim)
ADMIN = "admin"  # push subscriptions (every /subscriptions endpoint, GETs included)
SCOPES = (READ, WRITE, OPERATE, WORK, ADMIN)

_PREFIX = "rm_"
_SHAPE = re.compile(r"rm_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class NewSecret:
    key_id: str
    secret: str  # shown to the operator once, never stored

    @property
    def hash(self) -> str:
        return hash_secret(self.secret)


def new_secret() -> NewSecret:
    key_id = secrets.token_hex(8)
    return NewSecret(key_id, f"{_PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def key_id_of(secret: str) -> str | None:
    """The key id of a well-formed secret; ``None`` for anything else."""
    match = _SHAPE.fullmatch(secret)
    return match.group(1) if match else None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_hash: str) -> bool:
    """Whether ``secret`` hashes to ``stored_hash``, in time independent of where they differ."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)
