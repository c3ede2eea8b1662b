"""From a sweep to a decision: the links into MLflow's runs table and the report, the best
trial exported as a run config (``nalu-sweep best --format yaml|json``), and the end of
``nalu-sweep sweep`` (validate the top settings, build the report, say the verdict).

Heavy imports (MLflow, Ray, plotly) happen inside the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.cli.app import console
from service.cli.common import open_client
from service.errors import UserError

FORMATS = ("table", "yaml", "json")


# -- links ------------------------------------------------------------------------------------------
def mlflow_links(uri: str, experiment_id: str, parent_run_id: str | None = None,
                 report: bool = False, compare: list[str] = ()) -> list[str]:
    """Lines naming the sweep's views in MLflow: the top settings compared (``compare``: their
    run ids, see `compare_ids`), the report artifact, the whole runs table; with how to
    serve a local store."""
    from service.tracking.links import artifact_url, compare_runs_url, runs_table_url, ui_base

    base, served = ui_base(uri)
    lines = []
    if compare:
        lines.append(f"top settings in MLflow: {compare_runs_url(base, experiment_id, list(compare))}")
    if report and parent_run_id:
        lines.append(f"report in MLflow: {artifact_url(base, experiment_id, parent_run_id, 'report/report.html')}")
    lines.append(f"MLflow runs table: {runs_table_url(base, experiment_id)}")
    if not served:
        lines.append("  (serve it first with: nalu-sweep ui)")
    return lines


def compare_ids(view: Any, validations: dict[str, Any], top: int = 3) -> list[str]:
    """The run ids worth comparing: the ``top`` ranked trials, each followed by the
    validation runs pooled into its figure on fresh seeds (``validations``: trial run id →
    `PooledValidation`), so the search's interval and the fresh seeds' stand side by side."""
    ids = []
    for row in view.ranked()[:top]:
        ids.append(row.run_id)
        if row.run_id in validations:
            ids.extend(validations[row.run_id].run_ids)
    return ids


def print_links(uri: str, experiment_id: str, parent_run_id: str | None = None, report: bool = False,
                compare: list[str] = ()) -> None:
    for line in mlflow_links(uri, experiment_id, parent_run_id, report, compare):
        console.print(line, highlight=False, soft_wrap=True)


def print_sweep_links(uri: str, view: Any, report: bool = False, validations: dict[str, Any] | None = None) -> None:
    """`print_links` for a sweep read back from the store: its top settings compared with
    their pooled validations (read here unless given), its report when ``report``."""
    if validations is None:
        from service.tracking.pooled import pooled_validations

        validations = pooled_validations(open_client(uri), view)
    print_links(uri, view.experiment_id, view.run_id, report=report, compare=compare_ids(view, validations))


def has_report(view: Any) -> bool:
    """Whether `nalu-sweep report` logged a report to the sweep's parent run."""
    from service.tracking.best import TAG_REPORT

    return bool(view.tags.get(TAG_REPORT))


def ui_links(uri: str, base: str) -> list[str]:
    """One runs-table link per sweep in the store, for ``nalu-sweep ui``; a sweep recorded
    before its experiment shared the runs table's view gets it now (`share_missing_views`)."""
    from service.endpoints import check_tracking_uri
    from service.tracking import store
    from service.tracking.links import runs_table_url

    try:
        check_tracking_uri(uri)  # bounded: a server that does not answer must not hold `ui` in retries
        client = store.client(uri)
        experiments = store.retry(lambda: client.search_experiments())
    except Exception:  # noqa: BLE001 - the UI still starts; the links are a convenience
        return []
    experiments = [e for e in experiments if e.name != "Default"]
    share_missing_views(client, experiments)
    return [f"  {e.name}: {runs_table_url(base, e.experiment_id)}" for e in experiments]


def share_missing_views(client: Any, experiments: list[Any]) -> None:
    """Give each sweep's experiment that lacks it the shared view the links open (sweeps
    recorded by an earlier version); one that cannot be written is left as it is."""
    from service.tracking import runs
    from service.tracking.best import searched_names
    from service.tracking.links import SHARE_KEY, TAG_SHARED_VIEW, describe_experiment

    for e in experiments:
        if TAG_SHARED_VIEW + SHARE_KEY in (e.tags or {}):
            continue
        try:
            parent = runs.find_sweep_run(client, e.experiment_id, e.name)
            if parent is not None:
                searched = searched_names(dict(parent.data.params)) or []
                describe_experiment(client, e.experiment_id, e.name, searched)
        except Exception:  # noqa: BLE001 - a read-only server or user: the links still open the table
            continue


# -- the best trial as a run config ---------------------------------------------------------------------
def pick_trial(view: Any, trial: str | None, include_pruned: bool) -> Any:
    """The trial to export: ``trial`` (``trial-<id>``, its id, its run id or its run name),
    else the best by the objective."""
    if trial is None:
        rows = view.ranked(include_pruned)
        if not rows:
            raise UserError(f"sweep {view.name}: no finished trial yet")
        return rows[0]
    for row in view.trials:
        if trial in (row.name, row.name.removeprefix("trial-"), row.run_id, row.run_name):
            return row
    known = ", ".join(r.name for r in view.trials[:20]) or "(none)"
    raise UserError(f"sweep {view.name}: no trial {trial!r}; trials: {known}")


def trial_config_data(uri: str, view: Any, row: Any, task: str | None) -> tuple[str, dict[str, Any]]:
    """``(task, run config as plain data)`` of a trial, exactly as the sweep trained it;
    a sweep of several tasks needs ``task``."""
    from service.sweep.validation import trial_configs
    import os

    from service.tracking.queries import sweep_space
    from service.tracking.store import client

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stdout is the config

    space = sweep_space(client(uri), view.run_id)
    configs = trial_configs(space, row.params)
    if task is None:
        if len(configs) > 1:
            raise UserError(f"sweep {view.name} trains several tasks ({', '.join(configs)}): "
                            "choose one with --task NAME")
        task = next(iter(configs))
    if task not in configs:
        raise UserError(f"--task {task!r}: sweep {view.name} has tasks {', '.join(configs)}")
    return task, config_data(configs[task])


def config_data(config: Any) -> dict[str, Any]:
    """A run config as plain data, complete: ``serialize_as_any`` keeps the task's own
    fields (``kind``, ``operation``, …), which the field's declared base type would drop."""
    return config.model_dump(mode="json", serialize_as_any=True)


def export_config(uri: str, view: Any, row: Any, task: str | None, fmt: str) -> str:
    """The trial's complete run config as YAML (with a comment saying where it came from)
    or JSON; ``nalu-sweep run FILE`` trains exactly this configuration."""
    task, data = trial_config_data(uri, view, row, task)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    import yaml

    head = (f"# nalu-sweep best {view.name}: {row.name} ({row.run_name}), task {task}\n"
            f"# reuse it with: nalu-sweep run THIS_FILE\n")
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# -- the end of a sweep --------------------------------------------------------------------------------
def next_steps(name: str) -> None:
    console.print(f"next: [bold]nalu-sweep validate {name} --top 3[/] (fresh seeds), then "
                  f"[bold]nalu-sweep report {name}[/]; export the best with "
                  f"[bold]nalu-sweep best {name} --format yaml > best.yaml[/]", highlight=False)


def best_line(view: Any) -> None:
    from service.formatting import settings_label
    from service.tracking.best import judge, searched_names, setting_params, success_text

    rows = view.ranked()
    if not rows:
        console.print(f"sweep {view.name}: no trial completed, so there is no best setting", highlight=False)
        return
    best = rows[0]
    console.print(f"best setting: [bold]{settings_label(setting_params(best, searched_names(view.params)))}[/] "
                  f"({best.name}), {success_text(best.metrics)} seeds succeeded during the search",
                  highlight=False)
    judged = judge(best, None)
    if judged is not None:
        console.print(judged.sentence(), highlight=False)


def validate_and_report(uri: str, name: str, top: int, seeds: int, address: str | None,
                        stop_ray: bool = False) -> None:
    """``sweep --validate K``: validate the top K settings on fresh seeds, build the report,
    and end with the verdict, the robust setting and its intervals, and the links."""
    from service.report.build import build_report, choice_sentence, summary_fields
    from service.sweep.validation import validate_sweep

    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the report downloads many
    console.print(f"validating the top {top} setting(s) of {name} on {seeds} fresh seeds each", highlight=False)
    try:
        validate_sweep(uri, name, top, seeds, {}, address=address)
    finally:
        if stop_ray:  # the local Ray the sweep left running, or its connection, for this (`keep_ray`)
            from service.sweep.cluster import stop_ray as stop_local_ray

            stop_local_ray()
    files = build_report(uri, name, Path("reports") / name)
    fields = summary_fields(files.data)
    best, verdict = fields["best"], fields["verdict"]
    if best is None:
        console.print("no trial completed: nothing to recommend", highlight=False)
    else:
        from service.formatting import settings_label

        search, val = fields["search"], fields["validation"]
        words = verdict["words"] if verdict else "unknown"
        console.print(f"[bold]Verdict: {words}[/]", highlight=False)
        console.print(f"setting: [bold]{settings_label(best['params'])}[/] ({best['trial']})", highlight=False)
        console.print(f"  search:     {_interval_text(search)}", highlight=False)
        pooled = f" ({' + '.join(map(str, val['seeds_per_validation']))} seeds pooled)" \
            if val and len(val["seeds_per_validation"]) > 1 else ""
        console.print(f"  validation: {_interval_text(val)} on fresh seeds {val['seed_ids'] if val else '—'}"
                      f"{pooled}", highlight=False)
        if choice := choice_sentence(files.data):
            console.print(choice, highlight=False)
        console.print(f"reuse it: nalu-sweep best {name} --format yaml > best.yaml && nalu-sweep run best.yaml",
                      highlight=False)
    console.print(f"report: [bold]{files.html.resolve()}[/]", highlight=False)
    print_sweep_links(uri, files.data.view, report=True)


def _interval_text(part: dict[str, Any] | None) -> str:
    if not part:
        return "—"
    low, high = part.get("ci_low"), part.get("ci_high")
    from service.formatting import fmt_interval

    ci = fmt_interval(low, high, "–")
    ci = f" [95% CI {ci}]" if ci else ""
    return f"{part['successes']}/{part['n']} seeds{ci}"
