"""Which of a PUT's records the memory tier may keep once the store holds them.

The memory tier serves its records on the socket thread as they are, so it keeps only
records verified end to end (header against the client's key, xxh3 over the payload)
in memory that nothing writes any more: an immutable ``bytes`` value, or a ZeroMQ frame
the daemon received (its buffer is the daemon's alone once it arrived; the frame is kept
as it is, no copy). A record in memory a client may still write (a shared-memory put
area) or a caller's buffer is never kept: verifying it and then keeping it would keep
bytes that may have changed since.
"""

from __future__ import annotations

import zmq

from storage_backends.page_format import Verdict, validate
from storage_backends.remote.protocol import Frame

# A received frame smaller than this is copied rather than kept: ZeroMQ may have carved
# small messages out of one shared receive buffer, which a kept frame would pin whole
# (the tier charges a record's own bytes only). Copying a page this small costs little.
COPY_BELOW = 64 << 10


def keepable(record: Frame, client_key: bytes) -> Frame | None:
    """``record`` (a PUT's page record, stored under ``client_key``'s scoped key) as the
    memory tier may hold it: the record itself (``bytes``, or a received frame of
    ``COPY_BELOW`` bytes or more), a ``bytes`` copy of a smaller received frame; None
    when it fails its check (key, length, checksum) or its memory is not the daemon's
    alone. Hashes the payload once; mutates nothing."""
    if isinstance(record, bytes):
        owned: Frame = record
    else:
        view = memoryview(record)
        if not isinstance(view.obj, zmq.Frame):
            return None
        owned = bytes(view) if len(view) < COPY_BELOW else view
    if validate(memoryview(owned), client_key, None) is not Verdict.OK:
        return None
    return owned
