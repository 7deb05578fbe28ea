"""The ``disk`` backend: page records in segment files, an LMDB index (DESIGN §11)."""

from storage_backends.disk.backend import DiskBackend
from storage_backends.disk.writes import PutPhase

__all__ = ["DiskBackend", "PutPhase"]
