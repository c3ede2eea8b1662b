"""A new SQLite tracking store as a copy of a migrated blank, not by MLflow's migrations.

MLflow makes a new SQLite store by creating its first tables and running every alembic
migration since (about 1 s of CPU on the 2-core development machine) — on the first sweep
in a directory, the README's first command (issue 14, sweep overhead). What they produce
depends only on the versions of MLflow, SQLAlchemy and alembic, so the first store made
with a set of them is kept as a blank, schema only (no experiment, no run), in the private
cache directory of `service.native.compiler.cache_dir` (used only when owned by this user
and not writable by others); a new store is then a copy of it. MLflow opens the copy as it
opens any store: it checks the schema revision and creates its Default experiment, with
this store's artifact location, as it would have.

Before a copy is put in place it must read back whole and carry the schema revision the
installed MLflow expects; a blank that does not is deleted. Anything unexpected (no cache
directory, a blank to distrust) leaves MLflow to create the store itself, as before.
"""

from __future__ import annotations

import os
import secrets
import shutil
from importlib import metadata
from pathlib import Path

SQLITE = "sqlite:///"


def blank_path() -> Path:
    """The blank for the installed MLflow, SQLAlchemy and alembic (the schema's makers)."""
    from service.native.compiler import cache_dir

    versions = "-".join(f"{name}{metadata.version(name)}" for name in ("mlflow", "sqlalchemy", "alembic"))
    return Path(cache_dir()) / f"mlflow-store-{versions}.db"


def _aside(path: Path) -> Path:
    """A name beside ``path`` that no other process is using."""
    return path.with_name(f".{path.name}-{os.getpid()}-{secrets.token_hex(4)}")


def make_blank(path: Path) -> Path:
    """Create ``path`` as MLflow creates a new store's tables (its engine, its migrations),
    written aside and renamed into place, so a reader never sees half of it."""
    from mlflow.store.db import utils

    tmp = _aside(path)
    try:
        engine = utils.create_sqlalchemy_engine_with_retry(f"{SQLITE}{tmp}")
        try:
            utils._initialize_tables(engine)  # noqa: SLF001 - what SqlAlchemyStore runs for an empty database
        finally:
            engine.dispose()
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def place_blank(tracking_uri: str) -> Path | None:
    """For a SQLite store that does not exist yet: put a copy of the blank at its path
    (making the blank first if this is its first use) and return the path; else None.

    The copy is written aside with the mode a new file gets here (as MLflow's would) and
    linked into place only if no store appeared there meanwhile (a hard link does not
    replace an existing file), so a store another process just made is kept."""
    if not tracking_uri.startswith(SQLITE):
        return None
    target = Path(tracking_uri.removeprefix(SQLITE))
    if target.name == ":memory:" or target.exists():
        return None
    from service.native.compiler import check_private

    try:
        blank = blank_path()
        if not blank.is_file():
            make_blank(blank)
        check_private(str(blank), is_dir=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _aside(target)
        try:
            with open(blank, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst)
            if not is_current(tmp):
                blank.unlink(missing_ok=True)
                return None
            os.link(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - no blank, or none to trust: MLflow makes the store
        return None
    return target


def is_current(db: Path) -> bool:
    """True when ``db`` reads back whole and is at the schema revision the installed MLflow
    expects (what MLflow checks on opening a store, which would otherwise refuse it)."""
    import sqlite3

    from mlflow.store.db import utils

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        whole = conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return whole and revision == [(utils._get_latest_schema_revision(),)]  # noqa: SLF001 - MLflow's own check
