"""Serving processes: gunicorn's application and options, worker classes, stream hand-off, logs.

The one place that knows gunicorn; where it reaches past gunicorn's documented
settings (the worker classes in :mod:`~routemaster.server.workers`), the
dependency is bounded in ``pyproject.toml`` to the versions CI tests.
"""
