"""How the daemon's stores frame a client's page record, and how a stored record is framed
for the client again on the way out.

A client sends each page as a record (``page_format``: header with its key, length and
the payload's xxh3, then the payload); the writer checks its header against the key.
The store keeps that same record under the tenant-scoped key with the header's key field
rewritten to the scoped key (``put_records``): the checksum covers the payload only, so
nothing is hashed at PUT and no payload is copied. A GET reads the stored record whole
into the reply buffer (the store verifies it, checksum included, as every read: a record
whose checksum lies is a miss from its first read on, and dropped) and rewrites the key
field back to the client's key.

Stores written before (daemons up to session 9) hold *wrapped* records: the client's
record whole, as the payload of a store record. They stay readable. A stored record is
wrapped exactly when its payload starts with the header of a record of the client's key
whose length is the rest of the payload (magic, version, the client key, the length);
the wrapped record is then the payload itself, whose checksum the store's covered.

Why this is safe (the test can be fooled, never into serving another tenant's bytes).
It reads a record found under ``scoped_key(tenant, key)``, which only a PUT of ``key``
by ``tenant`` wrote, and the client's key is written into the reply only after the
store's lookup by that scoped key: whichever way a record is read, the tenant gets bytes
it stored under that key. A record written the new way is read as wrapped only if its
payload begins with a record header naming the same key and the exact remaining length
(46 given bytes, which page data does not hold by chance; a client that puts a record of
its own key as the payload of that key gets the inner record back, a length the remote
backend's reader refuses as a miss). A payload that starts with the magic and version but
not a matching header is a miss (for a wrapped record: damage; never bytes served).
"""

from __future__ import annotations

import logging

from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    KEY_BYTES,
    MAGIC,
    parse_header,
)
from storage_backends.trusted_records import rekey

logger = logging.getLogger(__name__)

# A wrapped record's payload opens with the magic and version of the client's header.
_WRAPPED_PREFIX = MAGIC + FORMAT_VERSION.to_bytes(2, "little")


def stored_size(payload_len: int) -> int:
    """The bytes a stored record of ``payload_len`` takes when read whole (the size of the
    buffer it is read into; the reply is at most this long)."""
    return HEADER_BYTES + payload_len


def for_client(stored: memoryview, client_key: bytes) -> memoryview | None:
    """The reply record of a record read whole from the store (a writable byte view,
    already verified by the store), framed for ``client_key``: the buffer itself with its
    key rewritten (a record stored the new way), the client's record inside it (a wrapped
    one: a view, no copy), or None when a wrapped record does not match the client's key
    (logged), as for a client key not of 32 bytes (no record of it can have been
    stored: a PUT's record header holds 32). Mutates ``stored``'s key field only."""
    if len(client_key) != KEY_BYTES:
        return None
    inner = stored[HEADER_BYTES:]
    if inner[: len(_WRAPPED_PREFIX)] != _WRAPPED_PREFIX:
        rekey(stored, client_key)
        return stored
    header = parse_header(inner)
    if header is not None and (header.key, header.payload_len) == (
        client_key,
        len(inner) - HEADER_BYTES,
    ):
        return inner
    logger.warning("a stored record (written wrapped) does not match its key; reported a miss")
    return None
