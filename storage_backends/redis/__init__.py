"""The ``redis`` backend (``backend``: pages in a Redis Cluster), its per-node fan-out (``nodes``)
and a local cluster of real ``redis-server`` processes for tests and benches (``cluster``)."""
