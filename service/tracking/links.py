"""Where to look in the MLflow UI, and how the sweep's experiment presents itself there.

MLflow 3 opens an experiment in its GenAI mode (traces, "Evaluations") unless the page is
asked for the classic runs table. Two things make the runs table the page a user lands on:

- every link printed carries ``?workflowType=machine_learning`` on the experiment's
  ``runs`` tab (the UI's own query parameter, read by MLflow 3.17's web app), sorted by
  the objective's primary part, ``success_ci_low``, best first (``orderByKey`` /
  ``orderByAsc``, the runs table's URL state);
- the experiment is tagged ``mlflow.experimentKind = custom_model_development``, the value
  the UI's own "experiment type" switch writes, so the root page opens it as a classic
  (machine-learning) experiment too.

MLflow has no supported way to preset the visible columns or chart order of an experiment
(the UI keeps them in the browser's local storage), so the description
(``mlflow.note.content``) says which columns to read, and the report is linked first.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from service.tracking.store import retry

TAG_NOTE = "mlflow.note.content"
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
CLASSIC_KIND = "custom_model_development"
SORT_KEY = "metrics.`success_ci_low`"
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
    """The experiment's runs table (not the GenAI overview), best ``success_ci_low`` first."""
    query = urlencode({"workflowType": "machine_learning", "orderByKey": SORT_KEY, "orderByAsc": "false"},
                      quote_via=quote)
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def artifact_url(base: str, experiment_id: str, run_id: str, path: str) -> str:
    """A run's artifact, opened in the run page's artifact viewer."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/{path}"


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


def describe_experiment(client: Any, experiment_id: str, sweep: str) -> None:
    """Tag the experiment as a classic one (runs table, not GenAI) and describe its table."""
    retry(lambda: client.set_experiment_tag(experiment_id, TAG_EXPERIMENT_KIND, CLASSIC_KIND))
    retry(lambda: client.set_experiment_tag(experiment_id, TAG_NOTE, experiment_note(sweep)))
