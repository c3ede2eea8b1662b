"""Where to look in the MLflow UI, and how the sweep's experiment presents itself there.

MLflow 3 opens an experiment in its GenAI mode (traces, "Evaluations") unless the page is
asked for the classic runs table. Three things make the runs table the page a user lands on:

- every link printed carries ``?workflowType=machine_learning`` (the UI's own query
  parameter, read by MLflow 3.17's web app);
- the experiment is tagged ``mlflow.experimentKind = custom_model_development``, the value
  the UI's own "experiment type" switch writes, so the root page opens it as a classic
  (machine-learning) experiment too.

- the runs table's sort (``success_ci_low``, best first) and columns are preset through
  the UI's own "share view" state (an experiment tag the link names, `view_state`): by
  default it shows no metric column at 1400 px (the UI keeps a user's columns in the
  browser's local storage).

Beside it, MLflow's compare-runs page of the top settings and their validations
(`compare_runs_url`) lists every parameter and metric of each run under a parallel-
coordinates plot; the experiment's description (``mlflow.note.content``) says which
columns to read.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

from service.tracking.store import retry

TAG_NOTE = "mlflow.note.content"
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
CLASSIC_KIND = "custom_model_development"
SORT_KEY = "metrics.`success_ci_low`"
TAG_SHARED_VIEW = "mlflow.sharedViewState."  # + key: the UI's shared view states of an experiment
SHARE_KEY = "nalu-sweep"
ML_WORKFLOW = "machine_learning"  # the UI's `workflowType` for the classic runs views (vs "genai")
DEFAULT_UI = "http://127.0.0.1:5000"  # where `nalu-sweep ui` serves a local store


def ui_base(tracking_uri: str, ui_url: str | None = None) -> tuple[str, bool]:
    """The MLflow UI's root URL for a tracking store and whether it is served already: a
    server's own URL (credentials removed), else where ``nalu-sweep ui`` serves it."""
    if ui_url:
        return ui_url.rstrip("/"), True
    if tracking_uri.startswith(("http://", "https://")):
        scheme, _, rest = tracking_uri.partition("://")
        host, slash, path = rest.partition("/")
        host = host.rpartition("@")[2]
        return f"{scheme}://{host}{slash}{path}".rstrip("/"), True
    return DEFAULT_UI, False


def runs_table_url(base: str, experiment_id: str) -> str:
    """The experiment's runs table (not the GenAI overview) in the experiment's shared view
    (`view_state`: best ``success_ci_low`` first, its columns). No sort or filter in the
    URL: the UI ignores a shared view when the URL has one."""
    query = urlencode({"workflowType": ML_WORKFLOW, "viewStateShareKey": SHARE_KEY}, quote_via=quote)
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def view_state(searched: list[str]) -> dict[str, Any]:
    """The runs table as the sweep's link opens it: sorted by ``success_ci_low``, the success
    interval's two ends first, then the searched parameters, then the seed counts; narrow
    columns, so that at 1400 px (with MLflow's side panels open) the interval and the first
    parameters are on screen. The run names hold every setting (``lr=0.012 optimizer=adam``).

    This is the state of the UI's own "share view" (an experiment tag
    ``mlflow.sharedViewState.<key>``, opened by ``?viewStateShareKey=<key>``); column ids
    are the table's (``metrics.`name```, ``params.`name```)."""
    columns = ([f"metrics.`{m}`" for m in ("success_ci_low", "success_ci_high")]
               + [f"params.`{p}`" for p in searched]
               + [f"metrics.`{m}`" for m in ("successes", "n_seeds", "solved_at_median", "sparsity_error_mean")])
    widths = {c: (104 if c.startswith("metrics") else 100) for c in columns}
    return {"orderByKey": SORT_KEY, "orderByAsc": False, "selectedColumns": columns,
            "columnOrder": ["attributes.`Run Name`", *columns], "runsHiddenMode": "SHOW_ALL",
            "columnWidths": {"attributes.`Run Name`": 150, **widths}}


def artifact_url(base: str, experiment_id: str, run_id: str, path: str) -> str:
    """A run's artifact, opened in the run page's artifact viewer, in the machine-learning
    view (without ``workflowType`` the UI falls back to the last mode the browser used,
    GenAI on a fresh one)."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/{path}"
            f"?workflowType={ML_WORKFLOW}")


def compare_runs_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare-runs page for ``run_ids``: a parallel-coordinates plot of their
    parameters above one table of each run's parameters and metrics (``success_ci_low``,
    ``successes``, ``n_seeds``, ...), readable without choosing a column. The page's own
    route, ``#/compare-runs?runs=[ids]&experiments=[ids]`` (JSON lists), percent-encoded so
    that a terminal or a chat keeps the link whole."""
    query = urlencode({"runs": json.dumps(list(run_ids), separators=(",", ":")),
                       "experiments": json.dumps([experiment_id], separators=(",", ":")),
                       "workflowType": ML_WORKFLOW}, quote_via=quote)
    return f"{base.rstrip('/')}/#/compare-runs?{query}"


def experiment_note(sweep: str) -> str:
    """How to read the sweep's experiment in the MLflow runs table (Markdown)."""
    return (
        f"**nalu-sweep `{sweep}`** — which settings of the unit learn robustly across seeds.\n\n"
        "* The run named after the sweep is the parent run: its description holds the verdict, its "
        "`nalu_sweep.best.*` tags the best setting, and its artifact `report/report.html` (after "
        f"`nalu-sweep report {sweep}`) the whole answer with plots.\n"
        "* Each trial is one child run, named by its settings (e.g. `lr=0.012 optimizer=adam`); "
        "runs named `validate: …` (tag `nalu_sweep.role = validation`) re-train a trial's setting on "
        "fresh seeds.\n"
        "* Sort by the metric **`success_ci_low`** (descending): the lower end of the 95% Wilson "
        "interval of the success rate, the sweep's objective. `successes` / `n_seeds` give the count, "
        "`solved_at_median` and `sparsity_error_mean` break ties.\n"
        "* A setting is robust when its *validation* run's `success_ci_low` is ≥ 0.8 "
        "(promising from 0.5).\n"
    )


def describe_experiment(client: Any, experiment_id: str, sweep: str, searched: list[str] = ()) -> None:
    """Tag the experiment as a classic one (runs table, not GenAI), describe its table, and
    share the runs table's view of the sweep (`view_state`) that the printed links open."""
    retry(lambda: client.set_experiment_tag(experiment_id, TAG_EXPERIMENT_KIND, CLASSIC_KIND))
    retry(lambda: client.set_experiment_tag(experiment_id, TAG_NOTE, experiment_note(sweep)))
    state = json.dumps(view_state(list(searched)))
    retry(lambda: client.set_experiment_tag(experiment_id, TAG_SHARED_VIEW + SHARE_KEY, state))
