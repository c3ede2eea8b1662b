"""Upper bounds on sizes a config may ask for: far above any real experiment, low enough
that a typo (``seeds: 1000000000``) is an error that names the cap instead of a crash or an
out-of-memory kill minutes later."""

MAX_SEEDS = 10_000
"""Seeds trained together (every tensor is ``[S, ...]``)."""
MAX_SEED = 2**63 - 1
"""``master_seed``, ``seed_offset``, ``dataset_seed`` and the sampler's seed fit in 64 bits."""
MAX_STEPS = 1_000_000_000
MAX_BATCH_SIZE = 1_000_000
MAX_WIDTH = 100_000
"""Inputs of a task and the width of a hidden layer."""
MAX_SAMPLES = 100_000_000
"""Evaluation samples and samples of the success-threshold simulation."""
MAX_TRIALS = 100_000
MAX_CONCURRENCY = 10_000
MAX_PACK = 1_000
"""Trials of a sweep trained as one computation (`pack`)."""
MAX_RETRIES = 1_000
MAX_CPUS = 10_000
MAX_GPUS = 1_000
MAX_PARAM_VALUE = 1e15
"""Bounds of a searched numeric range."""
