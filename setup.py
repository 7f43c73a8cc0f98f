from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="routemaster",
    version="2.0.0.dev0",
    description="State machines as a service.",
    long_description=Path(__file__).with_name("README.rst").read_text(encoding="utf-8"),
    long_description_content_type="text/x-rst",
    python_requires=">=3.11",
    packages=find_packages(include=["routemaster", "routemaster.*"]),
    package_data={
        "routemaster": [
            "py.typed",
            "api/static/*",
            "api/console/static/*",
            "api/console/templates/console/*.html",
            "config/*.json",
        ]
    },
    include_package_data=True,
    install_requires=[
        "alembic>=1.12",
        "click>=8.1",
        "flask>=3.0",
        "jinja2>=3.1",
        "gunicorn>=21.2",
        "jsonschema>=4.18",
        "prometheus-client>=0.17",
        "psycopg2-binary>=2.9.6",
        "pyyaml>=6.0",
        "regex>=2024.4",
        "requests>=2.31",
        "schedule>=1.2",
        "sqlalchemy>=2.0.20",
        "tzdata>=2023.3",
    ],
    extras_require={
        "embedded": ["pgserver>=0.1.4"],
        "dev": [
            "hypothesis>=6.80",
            "mypy>=1.8",
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "ruff>=0.4",
            "selenium>=4.10",
            "types-PyYAML",
            "types-jsonschema",
            "types-regex",
            "types-requests",
        ],
    },
    entry_points={"console_scripts": ["routemaster=routemaster.cli:main"]},
)
