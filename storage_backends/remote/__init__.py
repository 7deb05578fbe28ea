"""The cache daemon's client backend (``client``), its ZeroMQ channel (``channel``), the wire
protocol both ends use (``protocol``) and CURVE key files (``keys``): the daemon imports these,
never the other way. ``from storage_backends.remote import RemoteBackend`` keeps working: the
names of ``storage_backends.remote.client`` are looked up on first use."""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    return getattr(importlib.import_module("storage_backends.remote.client"), name)
