"""The allocator's one error type, in a module of its own so that both page
tables (``device_pool.page_table``, pure or compiled) raise the same class."""

from __future__ import annotations


class SlotError(ValueError):
    """Slots that are not whole pages, out of range, listed twice, or not in
    the state a call expects (a double free, a tree page freed by a request)."""
