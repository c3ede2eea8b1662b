"""What several verbs share: resolving and probing the tracking store, and the table cells
and printing that ``status``, ``best``, ``validate`` and ``compare`` have in common."""

from __future__ import annotations

from pathlib import Path

from service.cli.app import console
from service.errors import UserError

TRACKING_HELP = ("MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the "
                 "working directory).")
ADDRESS_HELP = ("Ray cluster to join: host:port of its head, or ray://host:10001 (default: $RAY_ADDRESS, else "
                "the Ray that `ray start --head` left running on this machine, else a local Ray started for "
                "this command and stopped after it). A cluster with token authentication gets its token from "
                "$RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token.")


def tracking_uri_of(option: str | None, must_exist: bool, probe: bool = True) -> str:
    """The resolved tracking URI; a server it names must answer within the connect timeout
    (`service.endpoints`), a local store must exist when ``must_exist``."""
    from service.endpoints import check_tracking_uri
    from service.tracking.store import resolve_tracking_uri

    uri = resolve_tracking_uri(option)
    if probe:
        check_tracking_uri(uri)
    if must_exist and uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise UserError(f"no tracking store at {path}: run a sweep here first, or pass --tracking-uri")
    return uri


def open_client(uri: str):
    """A client to read sweeps with (`service.tracking.queries`): for a local SQLite store
    of a schema it knows, the standard-library reader (`service.tracking.sqlite_reader`:
    no MLflow import, seconds of CPU less); otherwise an `MlflowClient`. A store MLflow
    refuses to open (a schema it does not know, …) is a `UserError`."""
    from service.tracking.sqlite_reader import open_reader

    reader = open_reader(uri)
    if reader is not None:
        return reader
    from service.tracking.store import client

    try:
        return client(uri)
    except Exception as e:  # noqa: BLE001 - MlflowException: e.g. an out-of-date schema
        raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None


def no_such_sweep(name: str, uri: str, known: list[str]) -> UserError:
    """``no sweep named 'x' in URI; did you mean 'y'? sweeps: …`` (every verb says it so)."""
    from service.errors import did_you_mean

    hint = did_you_mean(name, known)
    return UserError(f"no sweep named {name!r} in {uri}; {hint + ' ' if hint else ''}"
                     f"sweeps: {', '.join(known) or '(none)'}")


def require_sweeps(uri: str, *names: str, client=None) -> None:
    """Stop with `no_such_sweep` unless every name is a sweep in the store (before a verb
    prints or starts anything)."""
    from service.tracking.queries import sweep_names

    client = client or open_client(uri)
    try:
        known = sweep_names(client)
    except Exception as e:  # noqa: BLE001 - an unreachable or refusing tracking store
        raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None
    for name in names:
        if name not in known:
            raise no_such_sweep(name, uri, known)


def success_cell(metrics: dict[str, float]) -> str:
    """``3/4 [0.30, 0.95]``: successful seeds and the 95% Wilson interval of the rate;
    ``37/40 [0.80, 0.97] (32 + 8 seeds)`` for validations pooled (`service.tracking.pooled`)."""
    if "success_rate" not in metrics:
        return "—"
    if "successes" in metrics and "n_seeds" in metrics:
        text = f"{int(metrics['successes'])}/{int(metrics['n_seeds'])}"
    else:
        text = f"{metrics['success_rate']:.0%}"
    from service.formatting import fmt_interval

    ci = fmt_interval(metrics.get("success_ci_low"), metrics.get("success_ci_high"))
    if ci:
        text += f" [{ci}]"
    from service.tracking.pooled import parts

    seeds = parts(metrics)  # several validations pooled: how many seeds each gave
    if len(seeds) > 1:
        text += f" ({' + '.join(map(str, seeds))} seeds)"
    return text


def print_wide(renderable, out=None) -> None:
    """A table on ``out`` (default: the verbs' console). In a terminal it fits the width;
    into a file or pipe there is no width to fit, so it is printed at its natural width:
    no cell, header or row is wrapped, and each line can be searched or copied whole."""
    from rich.measure import Measurement

    out = out or console
    if out.is_terminal:
        out.print(renderable)
        return
    natural = Measurement.get(out, out.options.update_width(1_000_000), renderable).maximum
    width = out.width
    out.width = max(width, natural)
    try:
        out.print(renderable)
    finally:
        out.width = width
