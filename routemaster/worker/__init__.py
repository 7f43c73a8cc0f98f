"""The worker (``routemaster cron``): clock triggers, gate evaluation, action webhooks.

Any number of workers may run against one database; they share work through
PostgreSQL row locks and leases (see :mod:`routemaster.worker.claims`).
"""

from routemaster.worker.scheduler import Worker, run_worker

__all__ = ["Worker", "run_worker"]
