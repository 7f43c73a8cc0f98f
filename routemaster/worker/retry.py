"""How long to wait before retrying a failed action delivery: :mod:`routemaster.machine.retry`."""

from routemaster.machine.retry import backoff

__all__ = ["backoff"]
