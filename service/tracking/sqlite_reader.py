"""Read sweeps from a local SQLite tracking store with the standard library, not MLflow.

Importing MLflow and opening its SQLAlchemy store costs about 4 CPU seconds, most of a
read-only verb's time (``status``, ``best``, ``compare``), for a few small queries. For
an embedded ``sqlite:////abs/path/mlflow.db`` store whose schema revision (its
``alembic_version``) is one in `KNOWN_SCHEMAS`, `open_reader` returns a `SqliteReader`
that answers those queries from MLflow's tables (``experiments``, ``runs``, ``tags``,
``params``, ``latest_metrics``) through `sqlite3`, opened read-only. For any other store
(a server, another database, a schema this module does not know, MLflow workspaces) it
returns ``None`` and the caller uses an `MlflowClient`.

`SqliteReader` is the part of `MlflowClient` that `service.tracking.queries` reads with:
`get_experiment_by_name`, `search_experiments` and `search_runs` with a filter of tag
equalities (the only filters `queries` and `runs` write). It returns plain objects with the
attributes of MLflow's (``run.info.run_id``, ``run.data.metrics``, …) and the same values,
in the same order, as MLflow's own SQL store (`tests/tracking/test_sqlite_reader.py`).
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# alembic revisions of MLflow's tracking schema whose tables this module reads as MLflow
# does: the head of mlflow 3.17 (a test checks the installed MLflow writes one of these)
KNOWN_SCHEMAS = frozenset({"dc11669786a5"})
EXPERIMENTS_PAGE = 1000  # what one `MlflowClient.search_experiments()` returns at most
_BATCH = 500  # run ids per ``IN (...)``, well below SQLite's bound-parameter limit
_TAG_CLAUSE = re.compile(r"tags\.`([^`]+)`\s*=\s*'([^']*)'")
_AND = re.compile(r"\s+AND\s+", re.IGNORECASE)


@dataclass
class Experiment:
    experiment_id: str
    name: str
    lifecycle_stage: str
    artifact_location: str | None = None


@dataclass
class RunInfo:
    run_id: str
    run_name: str | None
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None
    lifecycle_stage: str
    artifact_uri: str | None


@dataclass
class RunData:
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Run:
    info: RunInfo
    data: RunData


class Page(list):
    """A list of results with MLflow's ``token`` for the next page (always the last page)."""

    token: str | None = None


def _sqlite_path(uri: str) -> Path | None:
    """The database file of ``sqlite:////abs/path``; ``None`` for any other form (a
    relative path, query parameters, percent-escapes, another driver)."""
    if not uri.startswith("sqlite:////") or any(c in uri for c in "?#%"):
        return None
    return Path(uri.removeprefix("sqlite:///"))


def _workspaces_enabled() -> bool:
    """MLflow scopes experiments to workspaces then (a store this module does not read)."""
    return os.environ.get("MLFLOW_ENABLE_WORKSPACES", "").strip().lower() not in ("", "0", "false")


def schema_revision(path: Path) -> str | None:
    """The store's alembic revision, or ``None`` when it has none or cannot be read."""
    try:
        conn = _connect(path)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return rows[0][0] if len(rows) == 1 else None


def open_reader(uri: str) -> SqliteReader | None:
    """A `SqliteReader` of the store ``uri`` when it is a local SQLite file of a known
    schema revision; otherwise ``None`` (read it with MLflow)."""
    path = _sqlite_path(uri)
    if path is None or _workspaces_enabled() or not path.is_file():
        return None
    if schema_revision(path) not in KNOWN_SCHEMAS:
        return None
    return SqliteReader(path)


def _connect(path: Path) -> sqlite3.Connection:
    """A read-only connection (never creates nor changes the file); transactions are
    begun and ended explicitly."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0, isolation_level=None)


def parse_tag_filter(filter_string: str) -> list[tuple[str, str]]:
    """``tags.`k` = 'v' AND …`` as ``[(k, v), …]`` (quotes trimmed, as MLflow does); any
    other filter is a `ValueError`: this reader answers only tag equalities."""
    clauses = []
    for part in _AND.split(filter_string.strip()):
        match = _TAG_CLAUSE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"the SQLite reader cannot search runs by {filter_string!r}")
        clauses.append((match.group(1), match.group(2)))
    return clauses


def _metric_value(value: float, is_nan: int) -> float:
    return math.nan if is_nan else float(value)


class SqliteReader:
    """MLflow's tables of one SQLite store, read the way MLflow's SQL store reads them:
    active experiments and runs only (an experiment by name in any stage), runs newest
    first then by id, a run's latest value of each metric (NaN where MLflow stored one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = _connect(path)

    def close(self) -> None:
        self._conn.close()

    def _read(self, fn):
        """``fn(connection)`` inside one read transaction: a consistent snapshot while a
        sweep writes to the same file."""
        self._conn.execute("BEGIN")
        try:
            return fn(self._conn)
        finally:
            self._conn.execute("ROLLBACK")

    # -- experiments ------------------------------------------------------------------------------
    def get_experiment_by_name(self, name: str) -> Experiment | None:
        rows = self._read(lambda c: c.execute(
            "SELECT experiment_id, name, lifecycle_stage, artifact_location FROM experiments "
            "WHERE name = ? AND lifecycle_stage IN ('active', 'deleted')", (name,)).fetchall())
        if len(rows) > 1:
            raise LookupError(f"{len(rows)} experiments named {name!r} in {self.path}")
        return _experiment(rows[0]) if rows else None

    def search_experiments(self, max_results: int = EXPERIMENTS_PAGE) -> Page:
        """The active experiments, newest first (the first page MLflow would return)."""
        rows = self._read(lambda c: c.execute(
            "SELECT experiment_id, name, lifecycle_stage, artifact_location FROM experiments "
            "WHERE lifecycle_stage = 'active' ORDER BY creation_time DESC, experiment_id ASC "
            "LIMIT ?", (max_results,)).fetchall())
        return Page(_experiment(r) for r in rows)

    # -- runs -------------------------------------------------------------------------------------
    def search_runs(self, experiment_ids: Iterable[str], filter_string: str = "",
                    max_results: int | None = None, page_token: str | None = None) -> Page:
        """Every active run of the experiments whose tags match ``filter_string`` (tag
        equalities only; `parse_tag_filter`), newest first, in one page."""
        ids = [int(i) for i in experiment_ids]
        clauses = parse_tag_filter(filter_string) if filter_string.strip() else []
        if not ids:
            return Page()
        sql = ("SELECT run_uuid, name, experiment_id, status, start_time, end_time, lifecycle_stage, "
               f"artifact_uri FROM runs r WHERE experiment_id IN ({_marks(ids)}) AND lifecycle_stage = 'active'")
        args: list[object] = list(ids)
        for key, value in clauses:
            sql += " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? AND t.value = ?)"
            args += [key, value]
        sql += " ORDER BY start_time DESC, run_uuid ASC"

        def read(conn: sqlite3.Connection) -> Page:
            rows = conn.execute(sql, args).fetchall()
            runs = {r[0]: Run(RunInfo(run_id=r[0], run_name=r[1], experiment_id=str(r[2]), status=r[3],
                                      start_time=r[4], end_time=r[5], lifecycle_stage=r[6],
                                      artifact_uri=r[7]), RunData()) for r in rows}
            self._fill(conn, runs)
            return Page(runs.values())

        return self._read(read)

    def _fill(self, conn: sqlite3.Connection, runs: dict[str, Run]) -> None:
        """Tags, params and latest metrics of ``runs``; a run without a name is named by
        its ``mlflow.runName`` tag, as MLflow names it."""
        ids = list(runs)
        for i in range(0, len(ids), _BATCH):
            chunk = ids[i:i + _BATCH]
            marks = _marks(chunk)
            for key, value, run_id in conn.execute(
                    f"SELECT key, value, run_uuid FROM tags WHERE run_uuid IN ({marks})", chunk):
                runs[run_id].data.tags[key] = value
            for key, value, run_id in conn.execute(
                    f"SELECT key, value, run_uuid FROM params WHERE run_uuid IN ({marks})", chunk):
                runs[run_id].data.params[key] = value
            for key, value, is_nan, run_id in conn.execute(
                    f"SELECT key, value, is_nan, run_uuid FROM latest_metrics WHERE run_uuid IN ({marks})", chunk):
                runs[run_id].data.metrics[key] = _metric_value(value, is_nan)
        for run in runs.values():
            if not run.info.run_name and run.data.tags.get("mlflow.runName"):
                run.info.run_name = run.data.tags["mlflow.runName"]


def _experiment(row: tuple) -> Experiment:
    return Experiment(experiment_id=str(row[0]), name=row[1], lifecycle_stage=row[2], artifact_location=row[3])


def _marks(values: list) -> str:
    return ", ".join("?" * len(values))
