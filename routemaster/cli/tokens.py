"""``routemaster token create | list | revoke``: API tokens for ``api: {authentication: tokens}``.

Part of the command line (:mod:`routemaster.cli` registers the group). A new
secret is printed once, to standard output alone, so it can be captured
(``SECRET=$(routemaster -c c.yaml token create ci --scope read)``); only its
hash is stored. Creating and revoking wait until every running API process
has the change, and say how many confirmed.
"""

from __future__ import annotations

import click
import sqlalchemy as sa

from routemaster.auth import SCOPES
from routemaster.auth.admin import (
    Confirmation,
    InvalidToken,
    TokenExists,
    create_token,
    list_tokens,
    revoke_token,
)
from routemaster.cli.environment import database_url
from routemaster.cli.options import direct_engine
from routemaster.db.errors import describe_failure
from routemaster.db.plumbing.database import create_engine, safe_url
from routemaster.db.upgrade import upgrade

CONFIRM_WITHIN = 10.0  # seconds to wait for running API processes to confirm a change


def _engine() -> sa.Engine:
    """The database, migrated (tokens may be made before the API first starts)."""
    url = database_url()
    engine: sa.Engine | None = None
    try:
        engine = create_engine(url, pool_size=1, max_overflow=1)
        upgrade(engine)
    except sa.exc.SQLAlchemyError as error:
        if engine is not None:
            engine.dispose()
        detail = describe_failure(error).detail
        raise click.ClickException(
            f"cannot use the database at {safe_url(url)}: {detail}"
        ) from None
    return engine


def _report(what: str, confirmation: Confirmation) -> None:
    if confirmation.polled:
        click.echo(
            f"{what}; this database URL delivers no notifications (a transaction-mode "
            "pooler?): API processes apply it within their poll interval "
            "(ROUTEMASTER_POLL_INTERVAL), and a new token works at its first use.",
            err=True,
        )
    elif confirmation.complete:
        click.echo(f"{what}; {confirmation.confirmed} running API process(es) confirmed.", err=True)
    else:
        click.echo(
            f"{what}; only {confirmation.confirmed} of {confirmation.listening} running API "
            f"processes confirmed within {CONFIRM_WITHIN:.0f}s (the others apply it as soon "
            "as they read their database connection).",
            err=True,
        )


@click.group("token")
def token() -> None:
    """API tokens (for api: {authentication: tokens})."""


@token.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(SCOPES),
    help="read (every GET), write (create/update/delete labels), operate (operator commands); "
    "repeat for several.",
)
def create(name: str, scopes: tuple[str, ...]) -> None:
    """Make a token and print its secret (shown this once only)."""
    engine = _engine()
    direct = direct_engine()
    try:
        secret, confirmation = create_token(
            engine, name, set(scopes), wait=CONFIRM_WITHIN, direct=direct
        )
    except TokenExists:
        raise click.ClickException(f"a token called {name!r} exists; revoke it first") from None
    except InvalidToken as error:
        raise click.ClickException(str(error)) from None
    finally:
        engine.dispose()
        if direct is not None:
            direct.dispose()
    click.echo(secret.secret)
    _report(f"Created token {name!r} with scopes {', '.join(sorted(scopes))}", confirmation)


@token.command("list")
def list_command() -> None:
    """Names, scopes, when each was made and last used (never the secrets)."""
    engine = _engine()
    try:
        tokens = list_tokens(engine)
    finally:
        engine.dispose()
    if not tokens:
        click.echo("No tokens.", err=True)
        return
    rows = [
        (
            stored.name,
            ",".join(sorted(stored.scopes)),
            stored.created_at.isoformat(timespec="seconds"),
            stored.last_used_at.isoformat(timespec="seconds") if stored.last_used_at else "never",
        )
        for stored in tokens
    ]
    header = ("NAME", "SCOPES", "CREATED", "LAST USED")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


@token.command("revoke")
@click.argument("name")
def revoke(name: str) -> None:
    """End a token at once in every API process."""
    engine = _engine()
    direct = direct_engine()
    try:
        confirmation = revoke_token(engine, name, wait=CONFIRM_WITHIN, direct=direct)
    finally:
        engine.dispose()
        if direct is not None:
            direct.dispose()
    if confirmation is None:
        raise click.ClickException(f"no token called {name!r}")
    _report(f"Revoked token {name!r}", confirmation)
