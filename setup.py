"""The package layout; everything else about the package is in pyproject.toml.

``migrations/`` stays at the repository root (where ``alembic`` expects it)
and ships inside the package as ``routemaster.migrations``.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["routemaster", "routemaster.*"]),
        "routemaster.migrations",
        "routemaster.migrations.versions",
    ],
    package_dir={"routemaster.migrations": "migrations"},
    include_package_data=True,  # the data files MANIFEST.in names
)
