"""The `nalu-sweep` Typer app, its consoles and the one way a verb reports a user error.

Verbs register themselves on `app` from their own modules (`service.cli.run`, `sweep`,
`analysis`); `service.cli` imports them all."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    help="Seed-robust hyperparameter search for neural arithmetic units "
    "(NAC, NALU, NAU, NMU, ...): train, sweep, and read off robust settings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """Seed-robust hyperparameter search for neural arithmetic units."""


def fail(message: str, code: int = 2) -> None:
    """Print a user-facing error (no traceback) and exit; a password inside a URI in the
    message (``scheme://user:pw@host``) is shown as ``***``."""
    from service.formatting import redact

    err_console.print(f"[bold red]error:[/] {redact(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
