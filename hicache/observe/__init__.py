"""Observability: the cache's observer (events and metrics of each operation), its counters and
the Prometheus exporter."""
