"""Alembic migrations, shipped in the package as ``routemaster.migrations``."""
