"""Per-process hubs: threads that hold clients' sockets, so no request worker waits.

The changes streams' hub (:mod:`routemaster.hubs.changes`: open streams fed
from the store's commit-safe reads) and the claims that wait for work
(:mod:`routemaster.hubs.claim_waits`). Beside the label service: the API
opens streams and waiting claims on them and the server hands their sockets
to them; they know neither Flask nor gunicorn.
"""
