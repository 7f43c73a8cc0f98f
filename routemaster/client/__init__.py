"""A worker for pull tasks (SPEC G4): ``Worker`` claims, runs a handler, heartbeats, drains.

It speaks only HTTP to the service (``docs/pull-workers.md`` documents the
protocol) and imports nothing of the server side, so it runs wherever
``requests`` does.
"""

from routemaster.client.service import Refused
from routemaster.client.task import Fail, Task
from routemaster.client.worker import Worker

__all__ = ["Fail", "Refused", "Task", "Worker"]
