"""Store tools over a store directory: read-only scans and checksum checks (``inspect``, behind
``hicache store inspect``/``verify``) and the LMDB-to-disk conversion (``migrate``)."""
