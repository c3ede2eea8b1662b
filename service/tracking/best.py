"""The sweep's answer on its parent run: the best setting as ``nalu_sweep.best.*`` tags and
a verdict in the run's description (``mlflow.note.content``).

Tags, not params: MLflow params cannot be overwritten, and the best trial can change when
a sweep is resumed or validated; tags of an earlier best that no longer apply are removed.
"""

from __future__ import annotations

from typing import Any, Iterable

from service.formatting import finite, fmt_interval, settings_label
from service.scoring.verdict import Verdict, verdict
from service.tracking.links import TAG_NOTE
from service.tracking.pooled import provenance
from service.tracking.queries import TrialRow, ranked
from service.tracking.store import retry

BEST_PREFIX = "nalu_sweep.best."
TAG_BEST_TRIAL = BEST_PREFIX + "trial"
TAG_BEST_RUN = BEST_PREFIX + "run_id"
TAG_BEST_SUCCESS = BEST_PREFIX + "success"
TAG_VERDICT = "nalu_sweep.verdict"  # robust, promising, not_robust
TAG_REPORT = "nalu_sweep.report"  # the report's artifact path, once `nalu-sweep report` logged it
_BOOKKEEPING = ("seeds", "steps", "eval_every")


def searched_names(parent_params: dict[str, str]) -> list[str] | None:
    text = parent_params.get("searched", "")
    return None if text in ("", "(none)") else [p.strip() for p in text.split(",")]


def setting_params(row: TrialRow, searched: list[str] | None) -> dict[str, str]:
    """The parameters that make the trial's setting: its searched ones (every logged one but
    the task's and the seed/step counts when the searched names are unknown)."""
    if searched is not None:
        return {k: row.params[k] for k in searched if k in row.params}
    return {k: v for k, v in row.params.items() if not k.startswith("task.") and k not in _BOOKKEEPING}


def success_text(metrics: dict[str, float]) -> str:
    k, n = metrics.get("successes"), metrics.get("n_seeds")
    ci = fmt_interval(metrics.get("success_ci_low"), metrics.get("success_ci_high"))
    text = f"{int(k)}/{int(n)}" if k is not None and n is not None else "?"
    return text + (f" [{ci}]" if ci else "")


def judge(row: TrialRow, validation: dict[str, float] | None) -> Verdict | None:
    """The verdict on a trial: on its validation metrics when validated, else its search's."""
    metrics = validation if validation else row.metrics
    return verdict(finite(metrics.get("success_ci_low")), validated=bool(validation))


def parent_note(sweep: str, row: TrialRow | None, searched: list[str] | None,
                validation: dict[str, float] | None = None, extra: Iterable[str] = ()) -> str:
    """The parent run's description: the best setting, its successes and the verdict."""
    if row is None:
        lines = [f"nalu-sweep `{sweep}`: no trial has completed yet."]
    else:
        lines = [f"nalu-sweep `{sweep}` — best setting: **{settings_label(setting_params(row, searched))}** "
                 f"({row.name}), search success {success_text(row.metrics)}."]
        if validation:
            pooled = provenance(validation)
            lines.append(f"On fresh seeds: {success_text(validation)}" + (f" ({pooled})." if pooled else "."))
        v = judge(row, validation)
        if v is not None:
            lines.append(f"**{v.sentence()}**")
        if not validation:
            lines.append(f"Validate on fresh seeds: `nalu-sweep validate {sweep} --top 3`, then "
                         f"`nalu-sweep report {sweep}`.")
    lines.extend(extra)
    return "\n\n".join(lines)


def record_best(client: Any, parent_run_id: str, sweep: str, trials: Iterable[TrialRow],
                validation: dict[str, float] | None = None, extra: Iterable[str] = (),
                report: str | None = None) -> TrialRow | None:
    """Tag the parent run with its best completed trial and describe it (and where its
    report is, when given); returns that trial."""
    parent = retry(lambda: client.get_run(parent_run_id))
    searched = searched_names(dict(parent.data.params))
    order = ranked(trials)
    row = order[0] if order else None
    tags: dict[str, str] = {TAG_NOTE: parent_note(sweep, row, searched, validation, extra)}
    if report:
        tags[TAG_REPORT] = report
    if row is not None:
        tags.update({TAG_BEST_TRIAL: row.name, TAG_BEST_RUN: row.run_id,
                     TAG_BEST_SUCCESS: success_text(row.metrics)})
        tags.update({BEST_PREFIX + k: str(v) for k, v in setting_params(row, searched).items()})
        v = judge(row, validation)
        if v is not None:
            tags[TAG_VERDICT] = v.key
    for key in parent.data.tags:  # an earlier best's parameters that this one does not have
        if key.startswith(BEST_PREFIX) and key not in tags:
            retry(lambda key=key: client.delete_tag(parent_run_id, key))
    from mlflow.entities import RunTag

    retry(lambda: client.log_batch(parent_run_id, tags=[RunTag(k, v[:5000]) for k, v in tags.items()]))
    return row
