"""API tokens: secrets and their hashes, the per-process cache, creating and revoking.

:mod:`~routemaster.auth.token_secrets` makes and checks secrets (pure),
:mod:`~routemaster.auth.cache` is what an API process checks requests
against (in memory, kept current by ``LISTEN``), :mod:`~routemaster.auth.admin`
is what the ``routemaster token`` commands do. The HTTP side (which endpoint
needs which scope, 401/403) is :mod:`routemaster.api.auth`.
"""

from routemaster.auth.token_secrets import ADMIN, OPERATE, READ, SCOPES, WORK, WRITE

__all__ = ["ADMIN", "OPERATE", "READ", "SCOPES", "WORK", "WRITE"]
