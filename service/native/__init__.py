"""Native C kernels: the sources (``philox.c``: the counter-based generator; ``units.c``: the
narrow linear layers and the two-input NMU; ``cpu_step.c``: the native CPU step of
`service.training.cpu_step`), shipped as package data, and the code that
compiles them into a private per-user cache and loads them (`service.native.compiler`).
`service.native.ordered` holds the torch-ops reductions in the kernels' order;
`service.native.constant` marks the availability probes as compile-time constants."""

from service.native.compiler import (
    ENV_CACHE,
    ENV_MALLOPT,
    ENV_NATIVE,
    UnsafeCacheError,
    build,
    cache_dir,
    errors,
    load,
    retain_freed_memory,
    source,
)
from service.native.constant import compile_time_constant

__all__ = ["ENV_CACHE", "ENV_MALLOPT", "ENV_NATIVE", "UnsafeCacheError", "build", "cache_dir",
           "compile_time_constant", "errors", "load", "retain_freed_memory", "source"]
