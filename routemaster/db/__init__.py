"""The one store: every SQL statement of the service, named for what it does.

Modules by subject: :mod:`~routemaster.db.labels` (label rows and their
history), :mod:`~routemaster.db.label_claims` (claims of labels: due gates,
deliveries, pull tasks, and their leases), :mod:`~routemaster.db.occurrences`
(clock-trigger occurrences), :mod:`~routemaster.db.listings` (read-only
listings, counts, health ping), :mod:`~routemaster.db.notifications`
(``LISTEN``/``NOTIFY``). Functions take an open connection, so the caller
decides what one transaction holds. Every statement is written and run one
way: :mod:`~routemaster.db.statements`.
"""
