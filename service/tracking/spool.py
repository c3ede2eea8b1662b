"""What a trial's journal (`service.tracking.journal`) still holds after its process ended:
sent later by a resume, the sweep's driver or ``python -m service.tracking.spool upload``.

An upload leaves out every metric point whose metric and step the run holds already,
whatever its timestamp (the sweep's driver logs a stopped trial's last result itself when
it closes the run for it), so no point is stored twice. A trial that Tune stops (pruned) may
be killed while its outbox drains; the sweep's driver sends such journals of its trials
before it closes their runs (`send_left_over`) and names, at its end, any of its store's
journals still kept (`left_over_note`).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from service.tracking import store
from service.tracking.journal import (  # the journal's names, where callers have found them
    JOURNAL,
    META,
    PATIENCE_ENV,
    SPOOL_ENV,
    UPLOAD_HINT,
    Entry,
    Outbox,
    patience_s,
    remove_empty,
    send_write,
    short_error,
    spool_root,
)
from service.tracking.store import is_transient

__all__ = ["JOURNAL", "META", "PATIENCE_ENV", "SPOOL_ENV", "UPLOAD_HINT", "Entry", "Outbox", "journalled_runs",
           "left_over", "left_over_note", "main", "patience_s", "recorded_uri", "remove_empty",
           "replay_left_over", "send_left_over", "send_write", "spool_root", "upload"]

log = logging.getLogger("nalu_sweep.tracking")


def recorded_uri(directory: Path) -> str | None:
    """The tracking URI a run's spool ``directory`` was written for (None if not recorded)."""
    try:
        return json.loads((directory / META).read_text()).get("tracking_uri")
    except (OSError, ValueError, AttributeError):
        return None


def upload(directory: Path, tracking_uri: str | None = None, timeout_s: float | None = None,
           client: Any = None) -> bool:
    """Send what a run's spool ``directory`` still holds (the server recorded in it unless
    ``tracking_uri`` is given; with ``client``, an `MlflowClient` of it), leaving out the
    metric points the run holds already (`Outbox._drop_stored`); True when everything
    arrived (the spool is then deleted)."""
    uri = tracking_uri or recorded_uri(directory)
    if not uri and client is None:
        raise ValueError(f"{directory}: no tracking URI recorded; pass --tracking-uri")
    try:
        outbox = Outbox(client or store.client(uri), directory.name, uri or "", root=directory.parent,
                        skip_stored=True)
    except Exception as e:  # noqa: BLE001 - sorted below: only an absent store keeps the journal quietly
        if not is_transient(e):
            raise
        log.error("run %s: the tracking store did not answer (%s); the writes stay in %s", directory.name,
                  short_error(e), directory)
        return False
    return outbox.close(timeout_s)


def journalled_runs(root: Path | None = None) -> set[str]:
    """The run ids with a journal in the spool ``root`` (default `spool_root`) on this machine."""
    try:
        return {p.name for p in (root or spool_root()).iterdir() if (p / JOURNAL).is_file()}
    except OSError:
        return set()


def send_left_over(client: Any, run_ids: list[str], timeout_s: float = 30.0) -> list[str]:
    """Send, with ``client`` (the sweep driver's `MlflowClient`), the journals this machine's
    spool holds for ``run_ids`` (trials Tune stopped while their outboxes drained), each
    removed once all of it arrived; returns the run ids sent. Stops at the first journal
    that does not drain in ``timeout_s`` (the store is away: the rest waits too)."""
    sent = []
    for run_id in run_ids:
        directory = spool_root() / run_id
        if not (directory / JOURNAL).is_file():
            continue
        try:
            if not upload(directory, timeout_s=timeout_s, client=client):
                break
        except Exception as e:  # noqa: BLE001 - a journal that cannot be sent stays, and is named at the end
            log.warning("run %s: could not send the writes left in %s (%s)", run_id, directory, short_error(e))
            continue
        sent.append(run_id)
    return sent


def left_over(tracking_uri: str, root: Path | None = None) -> list[Path]:
    """The run spools under ``root`` (default `spool_root`) still holding writes for ``tracking_uri``."""
    root = root or spool_root()
    return sorted(root / run_id for run_id in journalled_runs(root) if recorded_uri(root / run_id) == tracking_uri)


def left_over_note(tracking_uri: str, root: Path | None = None) -> str | None:
    """One line naming the journals still kept for ``tracking_uri`` and the command that
    uploads them (None when there are none): what a sweep says last."""
    kept = left_over(tracking_uri, root)
    if not kept:
        return None
    where = kept[0] if len(kept) == 1 else (root or spool_root())
    runs_text = f"run {kept[0].name}" if len(kept) == 1 else f"{len(kept)} runs"
    return (f"tracking writes of {runs_text} did not reach MLflow and are kept in {where}: "
            f"upload them with '{UPLOAD_HINT} {where}' once the store answers")


def replay_left_over(run_id: str, tracking_uri: str, timeout_s: float = 60.0) -> bool:
    """Send what this machine's spool still holds for ``run_id``, a run whose process died
    before its journal drained (a worker of a killed driver: a pruned member's last
    metrics and its close, say). True when the run had a journal and all of it arrived.
    A resume does this before it closes the runs left open, so that results already made
    reach MLflow; a journal it cannot send is kept, with a message saying how to upload it."""
    directory = spool_root() / run_id
    if not (directory / JOURNAL).exists():
        return False
    try:
        return upload(directory, tracking_uri, timeout_s)
    except Exception as e:  # noqa: BLE001 - the resume goes on; the journal stays where it is
        log.warning("run %s: could not send the writes left in %s (%s); upload them with '%s %s'",
                    run_id, directory, short_error(e), UPLOAD_HINT, directory)
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m service.tracking.spool upload [SPOOL_OR_RUN_DIR] [--tracking-uri URI]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m service.tracking.spool",
                                     description="upload tracking writes a trial kept while the server was away")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload")
    up.add_argument("directory", nargs="?", type=Path, default=None,
                    help=f"a run's spool directory, or the spool root (default ${SPOOL_ENV} or ~/.cache/nalu-sweep/spool)")
    up.add_argument("--tracking-uri", default=None)
    up.add_argument("--timeout", type=float, default=None, help="seconds to wait for the server per run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target = args.directory or spool_root()
    if not target.is_dir():
        print(f"error: {target} is not a spool directory (nothing to upload)", file=sys.stderr)
        return 2
    dirs = [target] if (target / JOURNAL).exists() else sorted(p for p in target.iterdir() if (p / JOURNAL).exists())
    failed = 0
    for directory in dirs:
        try:
            ok, why = upload(directory, args.tracking_uri, args.timeout), ""
        except Exception as e:  # noqa: BLE001 - e.g. an unknown run, or a store that is away: this one stays
            ok, why = False, f": {short_error(e)}"
        print(f"{directory.name}: {'uploaded' if ok else 'NOT uploaded (kept)'}{why}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
