"""Eviction, write and prefetch policies: small objects looked up by name in one registry each."""
