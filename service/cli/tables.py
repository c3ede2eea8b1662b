"""The tables `best`, `status` and a finished sweep print: the ranking of the robust
settings, and the most robust one, parameter by parameter."""

from __future__ import annotations

from rich.table import Table

from service.cli.common import success_cell
from service.formatting import MISSING, fmt_number, fmt_param


def _searched_names(view, rows) -> list[str]:
    """The searched parameters that have a value in at least one of ``rows`` (a conditional
    parameter no shown trial used would only be a column of dashes)."""
    names = view.searched or sorted({k for r in rows for k in r.params
                                     if not k.startswith(("task.", "regularizer."))
                                     and k not in ("seeds", "steps", "eval_every")})
    return [n for n in names if any(r.params.get(n) is not None for r in rows)]


def best_table(view, top: int, include_pruned: bool = False, width: int | None = None,
               validated: dict[str, dict[str, float]] | None = None) -> Table:
    """The robust settings of a sweep: parameters, success rate [95% CI], solved_at,
    sparsity error (mean over solved seeds at their best step, the papers' figure) and the
    final model's, ranked by the objective (the CI's lower end, then tie-breakers).

    ``validated`` (trial run id → metrics on fresh seeds) adds the validation interval beside
    the search's. Columns no row has a value in are left out. When one column per parameter would not
    fit in ``width`` characters (a terminal's), the parameters share one ``settings``
    column whose text wraps between them, so no value is cut short."""
    rows = view.ranked(include_pruned)[:top]
    names = _searched_names(view, rows)
    validated = validated or {}
    metric_cols = {"success [95% CI]": lambda m: success_cell(m),
                   "solved_at median": lambda m: fmt_number(m.get("solved_at_median"), ".0f"),
                   "sparsity error (solved, best step)": lambda m: fmt_number(m.get("sparsity_error_mean")),
                   "final sparsity error": lambda m: fmt_number(m.get("final_sparsity_error_mean")),
                   "diverged": lambda m: fmt_number(m.get("diverged"), ".0f")}
    race = {r.run_id: r.race for r in rows if r.race}  # a race: where each setting stands or left
    metric_cols = {col: cell for col, cell in metric_cols.items()
                   if col == "success [95% CI]" or any(cell(r.metrics) != MISSING for r in rows)}
    if any(r.run_id in validated for r in rows):  # beside the search's interval
        cols = list(metric_cols.items())
        cols.insert(1, ("validation [95% CI]", None))
        metric_cols = dict(cols)
    header = (["#", "trial", *names, *metric_cols, "objective"] + (["race"] if race else [])
              + (["outcome"] if include_pruned else []))
    body = []
    for i, r in enumerate(rows, 1):
        fresh = success_cell(validated[r.run_id]) if r.run_id in validated else MISSING
        cells = [str(i), r.name, *(fmt_param(r.params.get(n)) for n in names),
                 *(cell(r.metrics) if cell else fresh for cell in metric_cols.values()),
                 fmt_number(r.objective, ".4f")] + ([race.get(r.run_id, MISSING)] if race else [])
        body.append(cells + ([str(r.outcome)] if include_pruned else []))
    natural = sum(max(len(h), *(len(c[j]) for c in body)) + 3 for j, h in enumerate(header)) + 1 if body else 0
    table = Table(title=f"sweep {view.name}: top {len(rows)} by success_ci_low "
                        f"(lower end of the 95% Wilson interval)")
    if width is None or natural <= width:
        for h in header:
            table.add_column(h, justify="right" if h in metric_cols or h in ("#", "objective") else "left")
        for cells in body:
            table.add_row(*cells)
        return table
    # narrow: rank, trial, success and objective, the rest one paragraph that folds
    firsts = ("#", "trial", *(h for h in ("success [95% CI]", "validation [95% CI]") if h in metric_cols),
              "objective")
    for h in firsts:
        table.add_column(h, justify="left" if h == "trial" else "right", no_wrap=True)
    table.add_column("settings and metrics", overflow="fold")
    for cells in body:
        by = dict(zip(header, cells))
        details = [f"{n}={by[n]}" for n in names if by[n] != MISSING]
        details += [f"{h}: {by[h]}" for h in metric_cols if h not in firsts]
        if race:
            details.append(f"race: {by['race']}")
        if include_pruned:
            details.append(f"outcome: {by['outcome']}")
        table.add_row(*(by[h] for h in firsts), ", ".join(details))
    return table


def winner_table(view, include_pruned: bool = False,
                 validated: dict[str, dict[str, float]] | None = None) -> Table | None:
    """The most robust setting, one line per parameter and metric (fits any width), with
    its validation on fresh seeds when it has one."""
    rows = view.ranked(include_pruned)
    if not rows:
        return None
    r, m = rows[0], rows[0].metrics
    table = Table(title=f"most robust setting of {view.name}: {r.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    for name in _searched_names(view, [r]):
        table.add_row(name, fmt_param(r.params.get(name)))
    table.add_row("success [95% CI]", success_cell(m))
    if validated and r.run_id in validated:
        table.add_row("validation [95% CI]", f"{success_cell(validated[r.run_id])} on fresh seeds")
    for label, key, spec in (("solved_at median", "solved_at_median", ".0f"),
                             ("sparsity error (solved seeds, best step)", "sparsity_error_mean", None),
                             ("final sparsity error", "final_sparsity_error_mean", None),
                             ("diverged", "diverged", ".0f")):
        if m.get(key) is not None:
            table.add_row(label, fmt_number(m.get(key), spec) if spec else fmt_number(m.get(key)))
    table.add_row("objective", fmt_number(r.objective, ".4f"))
    return table
