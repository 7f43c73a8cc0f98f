"""Outbound HTTP: templated URLs, feeds fetched for evaluations, action webhooks.

Nothing here touches the database: callers hand in a ``requests.Session``
(shared, for keep-alive) and the compiled machine, and get back data or a
clear failure. Every request goes through :mod:`routemaster.http.client`:
one total deadline, a cap on the answer read, redirects never followed
blindly (see docs/limits.md).
"""
