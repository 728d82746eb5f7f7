"""``rinwa-index …``: the operator's and scripts' command line.

Exit status 0 on success, 1 on an operational error (one clear sentence on
stderr), 2 on a usage error (click's own). This is an entry point: it reads
``RINWA_*`` variables into a :class:`~rinwa_index.config.Config` and passes it down.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from .config import Config
from .errors import ModelError, RinwaError

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
        except sqlite3.OperationalError as exc:
            click.echo(f"Error: {_database_sentence(exc)}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _database_sentence(exc: sqlite3.OperationalError) -> str:
    text = str(exc)
    if "readonly" in text or "read-only" in text:
        return "The database is not writable; fix the permissions of the file and its folder."
    if "locked" in text or "busy" in text:
        return "The database is locked by another process; retry in a moment."
    return f"The database could not be used ({text}); check --db and the file."


class UsageError(RinwaError):
    """A command's input is unusable (exit status 1 with a clear sentence)."""


class WorkerNotRunning(RinwaError):
    """Work is pending and no worker is running to do it."""

    def __init__(self, pending: int) -> None:
        super().__init__(
            f"{pending} items are waiting but no worker is running for this database; "
            "start it with `rinwa-index worker` or under supervisord."
        )


class ModelNotReady(ModelError):
    """The model to enable is not installed or does not verify."""

    def __init__(self, name: str, state: str) -> None:
        what = (
            "does not match its pinned checksums"
            if state == "checksum_mismatch"
            else ("is not installed")
        )
        super().__init__(
            f"Model {name} {what}; run `rinwa-index model fetch {name}` "
            "(or `model install --from DIR`), then enable again."
        )


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
@click.option("-v", "--verbose", is_flag=True, help="Log events (JSON lines) on stderr.")
@click.version_option(package_name="rinwa-index")
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None, verbose: bool) -> None:
    """Private, on-device hybrid search for SQLite applications."""
    from .logs import configure_logging

    configure_logging(logging.DEBUG if verbose else logging.WARNING)
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


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", default=None, help="Chunk for this model (default: the default model).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every chunk.")
@click.pass_obj
@operational
def chunk(config: Config, file: Path, model: str | None, as_json: bool) -> None:
    """Show how a UTF-8 text FILE is chunked for a model."""
    import dataclasses

    from .chunking import chunker_for
    from .errors import ChunkingError
    from .models import get_manifest

    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChunkingError(
            f"{file.name} is not valid UTF-8 (bad byte at offset {exc.start}); convert it first."
        ) from None
    except OSError as exc:
        raise ChunkingError(f"Cannot read {file.name}: {exc.strerror}.") from None
    manifest = get_manifest(model, config.model_dir)
    chunker = chunker_for(manifest, config.chunk, config.model_dir)
    chunks = chunker.chunk(text)
    if as_json:
        rows = [dataclasses.asdict(c) for c in chunks]
        emit_json({"model": manifest.name, "limit": chunker.limit, "chunks": rows})
        return
    for c in chunks:
        path = " > ".join(c.heading_path) or "-"
        preview = " ".join(c.text.split())[:60]
        click.echo(
            f"{c.ord:>4}  {c.token_count:>3} tok  chars {c.char_start}-{c.char_end}  [{path}]  "
            f"{preview}"
        )
    click.echo(f"{len(chunks)} chunks for {manifest.name} (limit {chunker.limit} tokens).")


# --- models (rinwa_index.models) --------------------------------------------


@cli.group()
def model() -> None:
    """List, verify, install (from a directory) or fetch (from the hub) embedding models."""


@model.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")
@click.pass_obj
@operational
def model_list(config: Config, as_json: bool) -> None:
    """Every known model: installed, verified (every file hashed), the default marked *."""
    from .models import list_models

    statuses = list_models(config.model_dir)
    if as_json:
        emit_json([status.as_json() for status in statuses])
        return
    for s in statuses:
        state = "verified" if s.verified else ("FAILED" if s.installed else "not installed")
        click.echo(
            f"{'*' if s.default else ' '} {s.name:<24} {state:<14} {s.dim:>4} dims "
            f"{s.max_tokens:>4} tokens  ({s.source})"
        )


@model.command(name="verify")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")
@click.pass_obj
@operational
def model_verify(config: Config, name: str | None, as_json: bool) -> None:
    """Hash every file of NAME (default: every installed model); exit 1 on any mismatch."""
    from .models import get_manifest, list_models, model_status, verify_model

    if name is not None:
        manifest = get_manifest(name, config.model_dir)
        if not as_json:
            verify_model(manifest, config.model_dir)  # raises the precise sentence
        statuses = [model_status(manifest, config.model_dir)]
    else:
        statuses = [s for s in list_models(config.model_dir) if s.installed or s.default]
    if as_json:
        emit_json([status.as_json() for status in statuses])
    else:
        for s in statuses:
            click.echo(f"{s.name}: {'verified' if s.verified else s.problem or 'not installed'}")
    failed = [s.name for s in statuses if not s.verified]
    if failed:
        raise ModelError(
            f"{', '.join(failed)} did not verify; reinstall with `rinwa-index model fetch NAME` "
            "or `rinwa-index model install --from DIR`."
        )


@model.command(name="install")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A directory with the model files and a rinwa-model.json manifest.",
)
@click.pass_obj
@operational
def model_install(config: Config, source: Path) -> None:
    """Verify a model directory against its manifest and copy it into the model cache."""
    from .models import install_from_dir

    manifest = install_from_dir(source, config.model_dir)
    click.echo(
        f"Installed and verified {manifest.name} ({manifest.dim} dims, {manifest.max_tokens} "
        f"tokens); use it with `rinwa-index enable --model {manifest.name}`."
    )


@model.command(name="fetch")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Download without asking.")
@click.pass_obj
@operational
def model_fetch(config: Config, name: str, yes: bool) -> None:
    """Download NAME from the hub at its pinned revision, verify every file, install it.

    The hub is $RINWA_HF_ENDPOINT, else $HF_ENDPOINT, else huggingface.co.
    """
    from .fetch import DEFAULT_ENDPOINT, fetch_model
    from .models import get_manifest, model_status

    manifest = get_manifest(name, config.model_dir)
    if manifest.source != "hub":
        raise ModelError(
            f"Model {name} is not fetched from the hub ({manifest.source}); see `rinwa-index "
            "model list`."
        )
    if model_status(manifest, config.model_dir).verified:
        click.echo(f"Model {name} is already installed and verified.")
        return
    endpoint = _hub_endpoint() or DEFAULT_ENDPOINT
    size_mb = sum(entry.size or 0 for entry in manifest.files) / 1e6
    question = (
        f"Download {name} ({size_mb:.0f} MB) from {endpoint}/{manifest.repo} at revision "
        f"{manifest.revision[:12]}?"
    )
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"{question[:-1]} needs confirmation; pass --yes.")
        if not click.confirm(question, default=False, err=True):
            raise UsageError("Nothing was downloaded.")
    fetch_model(manifest, config.model_dir, endpoint=endpoint, progress=sys.stderr)
    click.echo(f"Model {name} is installed and verified.")


# --- worker and operations (rinwa_index.indexer, rinwa_index.outbox) -------


def _open(config: Config) -> sqlite3.Connection:
    """The database for an operational command; it must exist already."""
    from .db import connect

    return connect(config.db_path, busy_timeout_ms=config.busy_timeout_ms, must_exist=True)


@cli.command()
@click.argument("file", type=click.File("r", encoding="utf-8", errors="strict"))
@click.option("--batch", default=500, show_default=True, help="Items per transaction.")
@click.pass_obj
@operational
def ingest(config: Config, file: Any, batch: int) -> None:
    """Upsert items from a JSONL file and record each change (a host stand-in).

    Lines: {"id": int (optional), "title": str, "content": str, "source_content": str}.
    The whole file is checked first, so a malformed line changes nothing.
    """
    from .db import connect
    from .ingest import ingest_items, parse_items

    try:
        items = parse_items(file)
    except UnicodeDecodeError:
        raise UsageError("The file is not UTF-8 text; convert it and retry.") from None
    conn = connect(config.db_path, busy_timeout_ms=config.busy_timeout_ms)
    count = ingest_items(conn, items, batch=batch)
    conn.close()
    from .outbox import wake_worker

    wake_worker(config)
    click.echo(f"Ingested {count} items; the worker will index them.")


@cli.command()
@click.option("--until-idle", is_flag=True, help="Exit once nothing is pending.")
@click.pass_obj
@operational
def worker(config: Config, until_idle: bool) -> None:
    """Run the worker (the real Huey consumer, one thread) in the foreground."""
    _open(config).close()
    env = {
        **os.environ,
        "RINWA_DB": str(config.db_path.resolve()),
        "RINWA_MODEL_DIR": str(config.model_dir),
        "RINWA_QUEUE": str(config.queue_file.resolve()),
    }
    args = [sys.executable, "-m", "workers", *(["--until-idle"] if until_idle else [])]
    sys.stdout.flush()
    os.execve(sys.executable, args, env)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for monitoring.")
@click.option("--watch", is_flag=True, help="Refresh every two seconds until Ctrl-C.")
@click.pass_obj
@operational
def status(config: Config, as_json: bool, watch: bool) -> None:
    """Show dense on/off, the model, and current, pending and failed items."""
    import time

    from .status import collect

    conn = _open(config)
    while True:
        current = collect(conn, config)
        if as_json:
            emit_json(current.as_json())
        else:
            if watch:
                click.clear()
            click.echo(current.as_text())
        if not watch:
            break
        time.sleep(2)
    if current.stalled:
        raise WorkerNotRunning(current.pending)


@cli.command()
@click.option("--model", default=None, help="Switch to this model (see `model list`).")
@click.option("--yes", is_flag=True, help="Agree to fetch a hub model that is not installed yet.")
@click.option("--wait", is_flag=True, help="Show the backfill's progress until it is done.")
@click.pass_obj
@operational
def enable(config: Config, model: str | None, yes: bool, wait: bool) -> None:
    """Turn dense search on; the worker backfills vectors in the background."""
    from .models import get_manifest
    from .settings import get_settings, update_settings
    from .status import model_state

    conn = _open(config)
    name = model or get_settings(conn).model
    manifest = get_manifest(name, config.model_dir)
    state = model_state(config, manifest.name)
    if state != "ready" and manifest.source == "hub" and yes:
        from .fetch import fetch_model

        fetch_model(manifest, config.model_dir, endpoint=_hub_endpoint(), progress=sys.stderr)
        state = model_state(config, manifest.name)
    if state != "ready":
        raise ModelNotReady(manifest.name, state)
    update_settings(conn, enabled=True, model=manifest.name, model_dir=config.model_dir)
    _wake(config)
    click.echo(f"Dense search is on with {manifest.name}; the worker is backfilling vectors.")
    if wait:
        _wait_for_worker(config, conn, "items with vectors")
    conn.close()


@cli.command()
@click.pass_obj
@operational
def disable(config: Config) -> None:
    """Turn dense search off; keyword search keeps working, stored vectors are kept."""
    from .settings import update_settings

    conn = _open(config)
    update_settings(conn, enabled=False)
    conn.close()
    _wake(config)
    click.echo("Dense search is off; searches use keywords only.")


@cli.command()
@click.argument("items", nargs=-1, type=int)
@click.option("--all", "all_items", is_flag=True, help="Re-index every item.")
@click.option("--wait", is_flag=True, help="Show progress until the worker has caught up.")
@click.pass_obj
@operational
def reindex(config: Config, items: tuple[int, ...], all_items: bool, wait: bool) -> None:
    """Re-index some items (first) or all of them (as a background backfill)."""
    from .outbox import force_reindex

    if not items and not all_items:
        raise click.UsageError("Name item ids or pass --all.")
    conn = _open(config)
    count = force_reindex(conn, None if all_items else list(items))
    _wake(config)
    click.echo(f"Queued {count} items for re-indexing.")
    if wait:
        _wait_for_worker(config, conn, "items current")
    conn.close()


@cli.command(name="retry-failed")
@click.pass_obj
@operational
def retry_failed(config: Config) -> None:
    """Make failed and parked items due again."""
    from .outbox import retry_failed as retry

    conn = _open(config)
    count = retry(conn)
    conn.close()
    _wake(config)
    click.echo(f"Re-queued {count} items.")


def _wait_for_worker(config: Config, conn: sqlite3.Connection, label: str) -> None:
    """A progress bar (plain lines off a terminal) until the worker has caught up."""
    import time

    from .progress import Progress
    from .status import collect

    current = collect(conn, config)
    with Progress(current.items, label) as bar:
        while not current.caught_up:
            if current.stalled:
                raise WorkerNotRunning(current.pending)
            bar.update(current.dense_current if current.enabled else current.sparse_current)
            time.sleep(1)
            current = collect(conn, config)
        bar.update(current.items)


def _wake(config: Config) -> None:
    from .outbox import wake_worker

    wake_worker(config)


def _hub_endpoint() -> str | None:
    return os.environ.get("RINWA_HF_ENDPOINT") or os.environ.get("HF_ENDPOINT")


# --- search (rinwa_index.search) --------------------------------------------


@cli.command()
@click.argument("query", required=False)
@click.option(
    "--queries",
    "queries_file",
    type=click.File("r", encoding="utf-8"),
    help='A JSONL file of {"id", "text"} lines; one JSON result per line.',
)
@click.option("--item", "item_id", type=int, help="Search this item only.")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--mode", type=click.Choice(["hybrid", "sparse", "dense"]), default="hybrid", show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="JSON output (always, with --queries).")
@click.option("--explain", is_flag=True, help="Show each result's origin and both ranks.")
@click.option(
    "--deadline-ms",
    default=2000.0,
    show_default=True,
    help="How long a query waits for the dense side (the library's default is 250).",
)
@click.pass_obj
@operational
def search(
    config: Config,
    query: str | None,
    queries_file: Any,
    item_id: int | None,
    limit: int,
    mode: str,
    as_json: bool,
    explain: bool,
    deadline_ms: float,
) -> None:
    """Search the index: keyword, dense or both, fused (QUERY or --queries FILE).

    A one-shot tool: with dense search on, the query embedder is loaded
    before the first query. --mode sparse never loads the model; --mode
    dense skips keyword search (for evaluation).
    """
    import logging
    from typing import cast

    from .errors import DatabaseError
    from .index import Index
    from .logs import configure_logging
    from .search import Mode

    if (query is None) == (queries_file is None):
        raise click.UsageError("Give either QUERY or --queries FILE, not both or neither.")
    lines = _query_lines(queries_file) if queries_file is not None else [(None, query or "")]
    if not config.db_path.exists():
        raise DatabaseError(
            f"The database {config.db_path.name} does not exist; run `rinwa-index init` or check --db."
        )
    configure_logging(logging.WARNING)  # stdout carries results only
    with Index(config, dense_warmup=False) as index:
        if mode != "sparse":
            index.warm_up(wait=True, timeout=300)
        for query_id, text in lines:
            result = index.search(
                text, item_id=item_id, limit=limit, deadline_ms=deadline_ms, mode=cast(Mode, mode)
            )
            if queries_file is not None:
                emit_json({"id": query_id, **result.as_json()})
            elif as_json:
                emit_json(result.as_json(text))
            else:
                _print_results(result, explain)


def _query_lines(file: Any) -> list[tuple[Any, str]]:
    """``(id, text)`` of every non-blank line, all checked before the first search."""
    out: list[tuple[Any, str]] = []
    for number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise UsageError(f"Line {number} of the queries file is not JSON; fix it.") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UsageError(f'Line {number} of the queries file needs a "text" string; fix it.')
        out.append((record.get("id"), record["text"]))
    return out


def _print_results(result: Any, explain: bool) -> None:
    """Human-readable results: rank, item, score, a one-line excerpt."""
    skipped = f" (dense skipped: {result.reason})" if result.reason else ""
    click.echo(f"mode: {result.mode}{skipped}")
    if explain and result.dense_weight is not None:
        click.echo(f"dense weight {result.dense_weight:.2f} (sparse 1.00)")
    if explain and result.malformed_vectors:
        click.echo(f"{result.malformed_vectors} malformed vectors skipped")
    if not result.passages:
        click.echo("No matches.")
    for rank, p in enumerate(result.passages, start=1):
        where = " > ".join(p.heading_path)
        click.echo(f"{rank:>3}. item {p.item_id} #{p.ord}  {p.score:.4f}  {where}".rstrip())
        if explain:
            click.echo(
                f"     origin={p.origin} sparse_rank={p.sparse_rank} dense_rank={p.dense_rank}"
                f" chars={p.char_start}-{p.char_end}"
            )
        excerpt = " ".join(p.text.split())
        click.echo("     " + (excerpt[:157] + "…" if len(excerpt) > 160 else excerpt))


@cli.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.pass_obj
@operational
def demo(config: Config, directory: Path | None) -> None:
    """Index a sample library with the real worker and show hybrid searches.

    DIRECTORY (default ./rinwa-demo) receives the database and the worker's log.
    """
    from .demo import run_demo

    run_demo(directory or Path("rinwa-demo"), config, click.echo)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="rinwa-index")
