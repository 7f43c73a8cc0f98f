"""The worker (``routemaster cron``): clock triggers, gate evaluation, action webhooks.

Any number of workers may run against one database; they share work through
PostgreSQL row locks and leases (see :mod:`routemaster.db.label_claims`).
:mod:`~routemaster.worker.loop` is the loop, :mod:`~routemaster.worker.slots`
the delivery threads, :mod:`~routemaster.worker.clock_triggers` the clock,
:mod:`~routemaster.worker.delivery` one webhook, and
:mod:`~routemaster.worker.evaluation` the batches that move labels on.
"""

from routemaster.app import App
from routemaster.worker.loop import Worker
from routemaster.worker.signals import stopping_on_signals


def run_worker(app: App) -> None:
    """Run until SIGTERM or SIGINT, then finish in-flight work and return."""
    worker = Worker(app)
    with stopping_on_signals(worker.stop):
        worker.run()


__all__ = ["Worker", "run_worker"]
