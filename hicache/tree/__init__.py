"""The radix tree over token pages: nodes, matching and splitting, token-id packing, the door's
input checks, the integrity walk. Knows nothing of tiers, storage or config."""

from device_pool.native import use_compiled

use_compiled(__name__, __path__)  # the compiled token ids, when built (device_pool.native)
