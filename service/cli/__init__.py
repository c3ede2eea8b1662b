"""The `nalu-sweep` command line: the app and one module per verb group.

``run`` trains one configuration (`run`), ``sweep``/``status``/``best``/``ui`` drive and
read sweeps (`sweep`), ``validate``/``report``/``compare`` analyse them (`analysis`).
Importing this package registers every verb on `app`.
"""

# registration order is the order of `--help`
from service.cli import (
    analysis,  # noqa: E402,F401,I001
    run,  # noqa: E402,F401,I001
    sweep,  # noqa: E402,F401,I001
)
from service.cli.app import app

__all__ = ["app"]
