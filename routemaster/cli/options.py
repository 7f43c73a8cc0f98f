"""What every command shares: the layered configuration, its plugins, the database URL."""

from __future__ import annotations

import dataclasses
import sys

import click
import sqlalchemy as sa

from routemaster.cli.environment import direct_database_url, use_json_logs
from routemaster.config import ConfigError, load_config
from routemaster.config.model import Config
from routemaster.db.errors import describe_failure
from routemaster.db.plumbing.database import (
    DatabaseURLError,
    create_engine,
    safe_url,
    url_from_environment,
)
from routemaster.db.upgrade import upgrade
from routemaster.logging import BaseLogger, PluginError, load_plugins, wants_json


def named_database_url() -> str | None:
    """``DATABASE_URL`` or ``DB_*`` if set; one clear line (no password) if unusable."""
    try:
        return url_from_environment()
    except DatabaseURLError as error:
        raise click.ClickException(str(error)) from None


def unreachable(url: str, error: BaseException) -> click.ClickException:
    """The one line every command prints when the database cannot be used."""
    detail = describe_failure(error).detail
    return click.ClickException(f"cannot use the database at {safe_url(url)}: {detail}")


def migrate_database(url: str, *, recount: bool = False) -> None:
    """Migrate, or exit with one line saying why the database could not be used.

    No statement timeout here: a migration may legitimately take long. On the
    direct URL when one is given; else on ``url``, even through a transaction
    pooler: the whole upgrade is one transaction, under a transaction-scoped lock.
    """
    url = direct_database_url() or url
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        upgrade(engine, recount=recount)
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(url, error) from None
    finally:
        engine.dispose()


def direct_engine() -> sa.Engine | None:
    """An engine on ``ROUTEMASTER_DIRECT_DATABASE_URL`` (``App.direct``), or ``None``."""
    url = direct_database_url()
    return None if url is None else create_engine(url, pool_size=1, max_overflow=2)


def load_plugins_of(config: Config) -> list[BaseLogger]:
    from routemaster.api.plugins import provide_legacy_names

    provide_legacy_names()  # before any 1.x plugin imports them
    return load_plugins(config)


@dataclasses.dataclass(frozen=True)
class Options:
    config_paths: tuple[str, ...]

    def load(self) -> Config:
        """The layered config, or exit 1 listing every problem."""
        if not self.config_paths:
            raise click.UsageError("give the configuration: routemaster -c CONFIG.yaml COMMAND")
        try:
            return load_config(self.config_paths)
        except ConfigError as error:
            click.echo(str(error), err=True)
            sys.exit(1)

    def loggers(self, config: Config) -> tuple[BaseLogger, ...]:
        """The config's logging plugins, or exit 1 saying which one failed to load."""
        try:
            loggers = tuple(load_plugins_of(config))
        except PluginError as error:
            click.echo(str(error), err=True)
            sys.exit(1)
        if wants_json(loggers):
            use_json_logs()
        return loggers
