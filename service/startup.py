"""A process that loads many libraries at once, without the garbage collector scanning them
again and again.

Loading Ray Tune, MLflow with its SQL store, torch and this package creates about 400,000
objects that live as long as the process. Under Python's default thresholds the collector
runs a young collection every 700 new objects and, every hundred of those, a full one over
everything loaded so far: on the 2-core development machine that was 0.4-0.6 s of a sweep
driver's start and as much of a trial worker's, and the interpreter's final collections
scanned the same objects again for 0.9 s at exit.

`loading` raises the first threshold while a process loads what it needs (the collector
still runs, a hundred times less often: the `nalu-sweep` command from its start, a trial
worker around its imports), and `loaded` puts it back (a sweep's driver once Tune and the
store are open, `nalu-sweep run` once its trainer is built, a trial once its code is
imported) and freezes what was loaded (`gc.freeze`: later collections leave those objects
alone; they are freed as usual when the process ends). `collect_then_freeze`, the `nalu-sweep` process's last exit handler,
runs one collection (the finalizers of everything unreachable) and freezes the rest before
the interpreter's own finalization.
"""

from __future__ import annotations

import gc

LOADING_THRESHOLD = 100_000
"""New objects between two young collections while a process loads its libraries (Python's
default: 700)."""

_saved: tuple[int, int, int] | None = None
_froze = False


def loading() -> None:
    """The libraries are about to be loaded: fewer collections until `loaded`."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(max(LOADING_THRESHOLD, _saved[0]), _saved[1], _saved[2])


def loaded() -> None:
    """The libraries are loaded: the thresholds as they were, and, the first time in a
    process, what was loaded frozen (later, say a second trial in one worker, the garbage
    of the first would be frozen with it)."""
    global _saved, _froze
    if _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None
    if not _froze:
        gc.freeze()
        _froze = True


def collect_then_freeze() -> None:
    """A process's last exit handler: one full collection, then `gc.freeze`."""
    gc.collect()
    gc.freeze()
