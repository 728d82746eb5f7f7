"""``rinwa-index …``: the operator's and scripts' command line.

Exit status 0 on success, 1 on an operational error (one clear sentence on
stderr), 2 on a usage error (click's own). This is an entry point: it reads
``RINWA_*`` variables into a :class:`~rinwa_index.config.Config` and passes it down.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from .config import Config
from .errors import RinwaError

F = TypeVar("F", bound=Callable[..., Any])


def operational(func: F) -> F:
    """Turn a :class:`RinwaError` into one sentence on stderr and exit status 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RinwaError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def emit_json(data: object) -> None:
    """One JSON document on stdout."""
    click.echo(json.dumps(data, ensure_ascii=False))


@click.group()
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RINWA_DB",
    help="The SQLite database (default: $RINWA_DB, else ./rinwa.db).",
)
@click.version_option(package_name="rinwa-index")
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None) -> None:
    """Private, on-device hybrid search for SQLite applications."""
    ctx.obj = Config.from_env(os.environ, db_path=db_path)


@cli.command()
@click.pass_obj
@operational
def init(config: Config) -> None:
    """Create or upgrade the database schema (safe to repeat)."""
    from .db import connect, schema_version

    conn = connect(config.db_path, busy_timeout_ms=config.busy_timeout_ms)
    click.echo(f"Database ready at schema version {schema_version(conn)}.")
    conn.close()


# --- chunking (rinwa_index.chunking) ---------------------------------------

# --- models (rinwa_index.models) --------------------------------------------

# --- worker and operations (rinwa_index.indexer, rinwa_index.outbox) -------

# --- search (rinwa_index.search) --------------------------------------------


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="rinwa-index")
