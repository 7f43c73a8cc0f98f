"""Alembic revisions (alembic itself skips this file)."""
