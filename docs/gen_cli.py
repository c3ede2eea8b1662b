"""The CLI reference, generated from the Typer app itself (`service.cli.app`): every verb
with its description, usage, arguments and options, as Markdown. The docs' hook
(`docs/hooks.py`) puts it into `docs/cli.md` at build time, so the page cannot fall
behind the code; `python docs/gen_cli.py` prints it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _command(name: str, command: Any, ctx_class: Any, parent: Any) -> list[str]:
    ctx = ctx_class(command, info_name=name, parent=parent)
    pieces = " ".join(["[OPTIONS]"] + [p.name.upper() if p.required else f"[{p.name.upper()}]"
                                       for p in command.params if p.param_type_name == "argument"])
    lines = [f"## `nalu-sweep {name}`", "", (command.help or "").strip(), "",
             "```text", f"nalu-sweep {name} {pieces}".rstrip(), "```", ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.get_params(ctx) if p.param_type_name == "option"]
    if arguments:
        lines += ["| argument | required | description |", "|---|---|---|"]
        lines += [f"| `{p.name.upper()}` | {'yes' if p.required else 'no'} | {_cell(p.help or '')} |"
                  for p in arguments]
        lines.append("")
    if options:
        lines += ["| option | description |", "|---|---|"]
        for p in options:
            record = p.get_help_record(ctx)
            if record is None:  # hidden
                continue
            flags, help_text = record
            lines.append(f"| `{_cell(flags)}` | {_cell(help_text)} |")
        lines.append("")
    return lines


ORDER = ("sweep", "status", "best", "validate", "report", "compare", "run", "ui")  # a sweep's path


def cli_reference() -> str:
    """The whole reference: the app's help, then one section per verb in the app's order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import typer

    from service.cli import app

    group = typer.main.get_command(app)
    ctx_class = group.context_class
    root = ctx_class(group, info_name="nalu-sweep")
    lines = [(app.info.help or "").strip(), "",
             "Every verb prints its own help with `nalu-sweep VERB --help`. A mistake in a flag or a "
             "file ends the command with exit code 2 and one `error: …` paragraph.", ""]
    commands = sorted(group.commands.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER))
    lines += ["| verb | what it does |", "|---|---|"]
    for name, command in commands:
        lines.append(f"| [`{name}`](#nalu-sweep-{name}) | {_cell(command.get_short_help_str(limit=120))} |")
    lines.append("")
    for name, command in commands:
        lines += _command(name, command, ctx_class, root)
    return "\n".join(lines)


if __name__ == "__main__":
    print(cli_reference())
