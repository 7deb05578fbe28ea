"""What the benchmarks share: where figures came from (``provenance``), server subprocesses
(``processes``, the echo baseline ``zmq_echo``), scratch in shared stores (``scratch``), dropping
the page cache (``page_cache``) and seeded workloads (``workloads``)."""
