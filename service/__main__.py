"""``python -m service`` is the same as the ``nalu-sweep`` command."""

from service.cli import app

app(prog_name="nalu-sweep")
