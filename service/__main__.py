"""``python -m service`` is the same as the ``nalu-sweep`` command."""

from service.cli.entry import main

main()
