"""The device engine: a `Trainer`'s training loop and evaluations as fused Triton kernels.

`coverage` says which runs it trains (pure configuration check), `philox` draws the data
streams bit for bit, `kernels` hold the training and evaluation kernels, `layout` moves
state between the trainer and the kernels, `engine.Engine` drives them. A run the engine
does not cover trains on the torch path (`attach` prints a one-line notice).
See docs/engine.md.
"""

from service.engine.coverage import engine_gap, pack_gap
from service.engine.engine import attach, attach_on_gpu

__all__ = ["attach", "attach_on_gpu", "engine_gap", "pack_gap"]
