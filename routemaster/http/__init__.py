"""Outbound HTTP: templated URLs, feeds fetched for evaluations, action webhooks.

Nothing here touches the database: callers hand in a ``requests.Session``
(shared, for keep-alive) and the compiled machine, and get back data or a
clear failure.
"""
