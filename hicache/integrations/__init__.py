"""Adapters that let other engines use hicache's stores as their storage tier
(DESIGN §9): one module per engine (``sglang``), engine-independent parts in
``common``. Importing this package imports no engine."""
