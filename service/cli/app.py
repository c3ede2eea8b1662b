"""The `nalu-sweep` Typer app, its consoles and the one way a verb reports a user error.

Verbs register themselves on `app` from their own modules (`service.cli.run`, `sweep`,
`analysis`); `service.cli` imports them all. Every error a user sees, a verb's own
(`fail`) or the command line's (a missing argument, a bad option value), is one
``error: …`` paragraph on stderr, exit code 2."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

# MLflow draws a progress bar for every artifact it downloads (the spec of a sweep, a
# trial's seeds.csv...): noise in a terminal. Real warnings still come through.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# soft_wrap: a line of text (a command to copy, a link) is never broken by rich, in a
# terminal or a pipe; tables still fit the width they are given
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: message`` on stderr, with a password inside a URI shown as ``***``."""
    from service.formatting import redact

    err_console.print(f"[bold red]error:[/] {redact(message)}", highlight=False, soft_wrap=True, markup=True)


# Typer carries its own copy of click: its exception classes, found from a public one
_CLICK = {c.__name__: c for c in typer.BadParameter.__mro__}
ClickException, UsageError = _CLICK["ClickException"], _CLICK["UsageError"]


class _Group(TyperGroup):
    """Command-line mistakes (click's usage errors) in the same style as `fail`."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # the help, already shown
                sys.exit(e.exit_code)
            message = e.format_message()
            ctx = getattr(e, "ctx", None)
            if isinstance(e, UsageError) and ctx is not None:
                message = message.rstrip(".")
                message += ("" if message.endswith(("?", "!")) else ".") + f" See `{ctx.command_path} --help`."
            from rich.markup import escape

            print_error(escape(message))
            sys.exit(e.exit_code)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    help="Seed-robust hyperparameter search for neural arithmetic units "
    "(NAC, NALU, NAU, NMU, ...): train, sweep, and read off robust settings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Group,
)


@app.callback()
def _main() -> None:
    """Seed-robust hyperparameter search for neural arithmetic units."""
    from service.sweep.ray_join import use_token_when_given

    use_token_when_given()  # before a verb imports Ray, which reads RAY_AUTH_MODE once


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a user-facing error (no traceback) and exit; a password inside a URI in the
    message (``scheme://user:pw@host``) is shown as ``***``."""
    from rich.markup import escape

    print_error(escape(message))
    raise typer.Exit(code)
