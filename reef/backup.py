"""A deployment's backup and its restore elsewhere (`reef backup`, `reef restore`).

What a deployment is: its database (records, reports, the release chain, candidates,
consumptions: the truth), its artifact store (datasets and every release's files) and its MLflow
store (the registry's model versions and aliases). A backup copies the three into one directory,
in that order, while the server runs: the database first, as one consistent snapshot (SQLite's
online backup API; `pg_dump`, which reads one snapshot), then MLflow, then the artifacts. Files
are written before the rows that name them (a release's files are in the artifact store before
it is published), so every release and candidate the copied database names has its files in the
later copies; what was written after the snapshot is only more than it needs.

A restore puts them back into an empty deployment (a fresh state directory, an empty database),
rewrites where the artifact store was into where it is now (releases and candidates, MLflow's
paths) and brings the schema to this version's head: a backup of an older Reef restores into a
newer one. What lives elsewhere is not copied and is named in the backup's manifest: an S3
artifact store (use the bucket's versioning or replication) and an MLflow tracking server (back
up its own database and artifact root)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url

import reef
from reef.artifacts import artifacts_for
from reef.errors import ConfigError
from reef.records import utcnow
from reef.settings import Settings
from reef.store import tables
from reef.store.sql import open_store

MANIFEST = "reef-backup.json"
_SQLITE_DB, _PG_DUMP, _MLFLOW_DB, _ARTIFACTS = "reef.db", "reef.pgdump", "mlflow.db", "artifacts"


@dataclass
class Outcome:
    """What a backup or a restore did, part by part, and what it left to the operator."""

    manifest: dict[str, Any]
    done: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return Path(parsed.database or "").expanduser()


def _mlflow_sqlite(settings: Settings) -> Path | None:
    """MLflow's SQLite file (the default: state_dir/mlflow.db); None for a tracking server."""
    uri = settings.tracking_uri
    return _sqlite_path(uri) if uri.startswith("sqlite") else None


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """A SQLAlchemy Postgres URL as pg_dump/pg_restore take it, the password in the
    environment (never on a command line others can read)."""
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    plain = parsed.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _run(args: list[str], env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    except FileNotFoundError:
        raise ConfigError(f"{what} needs {args[0]} (PostgreSQL's client tools) on PATH") from None
    if done.returncode != 0:
        raise ConfigError(f"{what} failed ({args[0]} exited {done.returncode}): {done.stderr}")


def _sqlite_copy(source: Path, dest: Path) -> None:
    """`source` copied to `dest` with SQLite's online backup: a consistent snapshot, even
    while other processes write (WAL mode)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
        finally:
            out.close()
    finally:
        src.close()


def _heads_and_revision(url: str) -> tuple[dict[str, str], str | None]:
    store = open_store(url)
    try:
        heads = {s.name: s.head_release_id for s in store.list_scenarios()}
        with store.engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        store.close()
    return heads, revision


def backup(settings: Settings, dest: Path) -> Outcome:
    """The deployment `settings` describe, copied into `dest` (a new or empty directory)."""
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"{dest} is not empty: a backup goes into a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    url = settings.database_url
    heads, revision = _heads_and_revision(url)
    out = Outcome(
        {"format": 1, "reef_version": reef.__version__, "created_at": utcnow().isoformat()}
    )
    out.manifest.update(schema_revision=revision, heads=heads)
    if (path := _sqlite_path(url)) is not None:
        _sqlite_copy(path, dest / _SQLITE_DB)
        out.manifest["database"] = _SQLITE_DB
    else:
        dsn, env = _libpq(url)
        _run(["pg_dump", "--format=custom", "--file", str(dest / _PG_DUMP), dsn], env, "pg_dump")
        out.manifest["database"] = _PG_DUMP
    out.done.append(f"database ({out.manifest['database']}, schema {revision})")
    _backup_mlflow(settings, dest, out)
    _backup_artifacts(settings, dest, out)
    (dest / MANIFEST).write_text(json.dumps(out.manifest, indent=2) + "\n")
    return out


def _backup_mlflow(settings: Settings, dest: Path, out: Outcome) -> None:
    path = _mlflow_sqlite(settings)
    if path is None:
        out.manifest["mlflow"] = None
        out.notes.append(
            f"MLflow at {make_url_safe(settings.tracking_uri)} is not copied: back up that "
            "server's database and artifact root with it"
        )
        return
    if path.exists():
        _sqlite_copy(path, dest / _MLFLOW_DB)
        out.manifest["mlflow"] = _MLFLOW_DB
        out.done.append("MLflow (mlflow.db)")
    else:
        out.manifest["mlflow"] = None  # nothing registered yet


def _backup_artifacts(settings: Settings, dest: Path, out: Outcome) -> None:
    store = artifacts_for(settings)
    root = store.uri("")
    out.manifest["artifacts_root"] = root
    if not root.startswith("file://"):
        out.manifest["artifacts"] = None
        out.notes.append(
            f"the artifact store {root} is not copied: keep it (bucket versioning or "
            "replication); the restored deployment reads it where it is"
        )
        return
    source = Path(settings.artifacts_url).expanduser().resolve()
    if source.exists():
        shutil.copytree(source, dest / _ARTIFACTS)
    else:
        (dest / _ARTIFACTS).mkdir()
    out.manifest["artifacts"] = _ARTIFACTS
    out.done.append(f"artifacts ({root})")


def make_url_safe(uri: str) -> str:
    """A URI as it may be printed: a password in it masked."""
    try:
        return make_url(uri).render_as_string(hide_password=True)
    except Exception:
        return uri.split("@")[-1] if "@" in uri else uri


def restore(settings: Settings, source: Path) -> Outcome:
    """The backup in `source` put into the empty deployment `settings` describe."""
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{source} holds no {MANIFEST}: not a reef backup") from None
    if manifest.get("format") != 1:
        raise ConfigError(f"{source}: backup format {manifest.get('format')!r} is not known")
    out = Outcome(manifest)
    _restore_database(settings, source, out)
    _restore_mlflow(settings, source, out)
    new_root = _restore_artifacts(settings, source, out)
    store = open_store(settings.database_url)
    try:
        store.migrate()  # a backup of an older Reef: its schema brought to this one's
        old_root = manifest.get("artifacts_root")
        if new_root is not None and old_root and old_root != new_root:
            n = _rewrite_reef(store.engine, old_root + "/", new_root + "/")
            m = _rewrite_mlflow(settings, old_root + "/", new_root + "/")
            out.done.append(f"moved {n} release files and {m} MLflow paths to {new_root}")
        heads = {s.name: s.head_release_id for s in store.list_scenarios()}
    finally:
        store.close()
    if heads != manifest.get("heads"):
        raise ConfigError(f"restored heads {heads} differ from the backup's {manifest['heads']}")
    return out


def _restore_database(settings: Settings, source: Path, out: Outcome) -> None:
    url, kind = settings.database_url, out.manifest.get("database")
    target = _sqlite_path(url)
    if (kind == _SQLITE_DB) != (target is not None):
        where = "SQLite" if kind == _SQLITE_DB else "PostgreSQL"
        raise ConfigError(f"this backup's database is {where}: restore it into {where}")
    if target is not None:
        if target.exists() and target.stat().st_size > 0:
            raise ConfigError(f"{target} exists: a restore goes into an empty deployment")
        target.parent.mkdir(parents=True, exist_ok=True)
        _sqlite_copy(source / _SQLITE_DB, target)
    else:
        store = open_store(url)
        try:
            with store.engine.connect() as conn:
                found = conn.execute(
                    text(
                        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
                    )
                ).scalar_one()
        finally:
            store.close()
        if found:
            raise ConfigError(
                "the target database has tables: a restore goes into an empty deployment"
            )
        dsn, env = _libpq(url)
        args = ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error"]
        _run([*args, "--dbname", dsn, str(source / _PG_DUMP)], env, "pg_restore")
    out.done.append(f"database ({make_url_safe(url)})")


def _restore_mlflow(settings: Settings, source: Path, out: Outcome) -> None:
    if not out.manifest.get("mlflow"):
        return
    target = _mlflow_sqlite(settings)
    if target is None:
        out.notes.append(
            f"the backup's mlflow.db is not restored: MLflow is {make_url_safe(settings.tracking_uri)}"
        )
        return
    if target.exists():
        raise ConfigError(f"{target} exists: a restore goes into an empty deployment")
    target.parent.mkdir(parents=True, exist_ok=True)
    _sqlite_copy(source / _MLFLOW_DB, target)
    out.done.append(f"MLflow ({target})")


def _restore_artifacts(settings: Settings, source: Path, out: Outcome) -> str | None:
    """Copies the backup's artifacts into the configured local artifact store; returns its
    root uri (None: nothing copied, the store is where the backup's manifest says)."""
    if not out.manifest.get("artifacts"):
        return None
    store = artifacts_for(settings)
    root = store.uri("")
    if not root.startswith("file://"):
        raise ConfigError(
            f"the backup's artifacts are files; {root} is not a directory: copy "
            f"{source / _ARTIFACTS} there yourself (aws s3 sync), then restore with "
            "artifacts.url set to a directory, or restore into a local one"
        )
    target = Path(settings.artifacts_url).expanduser().resolve()
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"{target} is not empty: a restore goes into an empty deployment")
    shutil.copytree(source / _ARTIFACTS, target, dirs_exist_ok=True)
    out.done.append(f"artifacts ({root})")
    return root


def _rewrite_reef(engine: Any, old: str, new: str) -> int:
    """Releases' and candidates' file uris under `old` moved under `new`."""
    n = 0
    with engine.begin() as conn:
        for table in (tables.releases, tables.candidates):
            rows = conn.execute(select(table.c.id, table.c.uri).where(table.c.uri.startswith(old)))
            for row_id, uri in rows.all():
                moved = new + uri[len(old) :]
                conn.execute(update(table).where(table.c.id == row_id).values(uri=moved))
                n += 1
    return n


def _rewrite_mlflow(settings: Settings, old: str, new: str) -> int:
    """Every path MLflow's SQLite store keeps (experiments' artifact locations, runs' artifact
    uris, model versions' sources) under `old` moved under `new`: by column, whatever MLflow's
    schema version, as `file://` uris and as plain paths."""
    path = _mlflow_sqlite(settings)
    if path is None or not path.exists():
        return 0
    if old.startswith("file://") and new.startswith("file://"):
        # the plain path is in the file:// uri too: one replace covers both forms
        old, new = old.removeprefix("file://"), new.removeprefix("file://")
    n = 0
    db = sqlite3.connect(path)
    try:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for name in names:
            for col in db.execute(f'PRAGMA table_info("{name}")').fetchall():
                if not any(t in str(col[2]).upper() for t in ("CHAR", "TEXT", "CLOB")):
                    continue
                cur = db.execute(
                    f'UPDATE "{name}" SET "{col[1]}" = replace("{col[1]}", ?, ?) '
                    f'WHERE instr("{col[1]}", ?) > 0',
                    (old, new, old),
                )
                n += cur.rowcount
        db.commit()
    finally:
        db.close()
    return n
