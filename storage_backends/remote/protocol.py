"""The daemon's wire protocol v1 (``docs/protocol.md``), shared by server and client.

A message is a list of frames: frame 0 is a msgpack map (the header), then raw
payload frames. This module turns frames into typed records and back and
checks every field and limit; it depends only on msgpack and the standard
library so that ``storage_backends.remote.client`` may import it. It never touches
sockets: callers pass ``bytes``/``memoryview`` frames (``zmq.Frame.buffer``)
without the ROUTER identity frame.

Every function is pure and thread-safe. Decoding raises ``ProtocolError``
(carrying the reply's error code and the request id when it was readable);
encoding raises ``ValueError`` for a record that breaks the protocol.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

VERSION = 1
MAX_ID = 2**63
Frame = bytes | memoryview
StatValue = int | float


class Op(enum.StrEnum):
    PING = "PING"
    EXISTS = "EXISTS"
    GET = "GET"
    PUT = "PUT"
    DELETE = "DELETE"
    STATS = "STATS"
    CONTAINS = "CONTAINS"
    # The shared-memory data plane (ipc only, ``server.shm_bytes`` > 0; docs/protocol.md).
    SHM_ATTACH = "SHM_ATTACH"
    SHM_FREE = "SHM_FREE"  # no reply
    SHM_DETACH = "SHM_DETACH"  # no reply


KEYED_OPS = frozenset({Op.EXISTS, Op.CONTAINS, Op.GET, Op.PUT, Op.DELETE})
# Requests the daemon never answers (a client sends them and moves on).
UNANSWERED_OPS = frozenset({Op.SHM_FREE, Op.SHM_DETACH})
# Requests that may name a shared-memory lease.
LEASE_OPS = frozenset({Op.GET, Op.PUT, Op.SHM_ATTACH, Op.SHM_FREE, Op.SHM_DETACH})


class ErrorCode(enum.StrEnum):
    BAD_VERSION = "BAD_VERSION"
    BAD_OP = "BAD_OP"
    MALFORMED = "MALFORMED"
    BAD_FRAMES = "BAD_FRAMES"
    TOO_LARGE = "TOO_LARGE"
    UNAUTHORIZED = "UNAUTHORIZED"
    INTERNAL = "INTERNAL"
    BUSY = "BUSY"
    NO_LEASE = "NO_LEASE"  # the shared-memory lease named is unknown (reclaimed, or shm off)


class ProtocolError(Exception):
    """A message that breaks the protocol; ``request_id`` is None when it was unreadable."""

    def __init__(self, code: ErrorCode, message: str, request_id: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Limits:
    """Size limits every request is checked against (the daemon config's defaults)."""

    max_batch_keys: int = 4096
    max_key_bytes: int = 256
    max_page_bytes: int = 64 << 20
    max_request_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for name in ("max_batch_keys", "max_key_bytes", "max_page_bytes", "max_request_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_request_bytes < self.max_page_bytes:
            raise ValueError("max_request_bytes must be >= max_page_bytes")

    @property
    def max_header_bytes(self) -> int:
        """Largest frame 0 a valid request can have (keys plus a little for the fields)."""
        return 1024 + self.max_batch_keys * (self.max_key_bytes + 5)

    @property
    def max_frame_bytes(self) -> int:
        """Largest single frame a valid request can have (for ``zmq.MAXMSGSIZE``)."""
        return max(self.max_header_bytes, self.max_page_bytes)


# --- records ------------------------------------------------------------------------------


class Span(NamedTuple):
    """A byte range of the daemon's shared-memory slab (one page record)."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Request:
    """One request. ``pages`` are the PUT page records (one per key); empty for other ops.

    Shared memory: ``lease`` (0: none) names the client's lease; a PUT through it has
    ``spans`` (one record per key, in the lease's put area) instead of ``pages``, an
    SHM_FREE the spans of GET replies it has copied out; ``put_bytes`` is the put area
    an SHM_ATTACH asks for."""

    op: Op
    id: int
    keys: tuple[bytes, ...] = ()
    pages: tuple[Frame, ...] = ()
    lease: int = 0
    spans: tuple[Span, ...] = ()
    put_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PingReply:
    id: int
    server: str


@dataclass(frozen=True, slots=True)
class ExistsReply:
    id: int
    count: int


@dataclass(frozen=True, slots=True)
class ContainsReply:
    """``present`` holds one entry per requested key, in order."""

    id: int
    present: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class GetReply:
    """``pages`` holds one record per True entry of ``found``, in order; or, for a GET
    through a shared-memory lease, ``spans`` does (where each record lies in the slab)."""

    id: int
    found: tuple[bool, ...]
    pages: tuple[Frame, ...]
    spans: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class PutReply:
    id: int
    stored: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class DeleteReply:
    id: int
    deleted: int


@dataclass(frozen=True, slots=True)
class StatsReply:
    id: int
    stats: Mapping[str, StatValue]


@dataclass(frozen=True, slots=True)
class ShmAttachReply:
    """A lease on the slab at ``path`` (``size`` bytes): ``put`` is the lease's own area
    for PUT records (length 0: none free); the lease is reclaimed once the client has
    been silent, with nothing in flight, for ``expires_s``."""

    id: int
    lease: int
    path: str
    size: int
    put: Span
    expires_s: float


@dataclass(frozen=True, slots=True)
class ErrorReply:
    id: int | None
    code: ErrorCode
    message: str


Reply = (
    PingReply
    | ExistsReply
    | ContainsReply
    | GetReply
    | PutReply
    | DeleteReply
    | StatsReply
    | ShmAttachReply
    | ErrorReply
)


# --- helpers ------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_id(value: object) -> bool:
    return _read_id(value) is not None


def _read_id(value: object) -> int | None:
    """``value`` as a request id, or None if it is not one."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_ID:
        return value
    return None


def _pack(header: Mapping[str, object]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def _unpack_header(frame: Frame, max_bytes: int) -> dict[str, object]:
    """Decode frame 0 as a msgpack map with str keys; MALFORMED otherwise."""
    if len(frame) > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"header of {len(frame)} bytes > {max_bytes}")
    try:
        # Length caps bound what a hostile count can make the decoder allocate.
        header = msgpack.unpackb(
            frame,
            raw=False,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=max_bytes,
            max_map_len=max_bytes,
            max_ext_len=max_bytes,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, StackError…)
        raise ProtocolError(ErrorCode.MALFORMED, f"header is not msgpack: {exc!r:.200}") from None
    if not isinstance(header, dict):
        raise ProtocolError(ErrorCode.MALFORMED, f"header is a {type(header).__name__}, not a map")
    if not all(isinstance(key, str) for key in header):
        raise ProtocolError(ErrorCode.MALFORMED, "header map keys must be strings")
    return header


# --- requests -----------------------------------------------------------------------------


def encode_request(request: Request) -> list[Frame]:
    """Frames of ``request`` (header, then its pages). ValueError if it breaks the protocol."""
    if not _valid_id(request.id):
        raise ValueError(f"request id must be an int in [0, 2**63), got {request.id!r}")
    by_frames = request.op is Op.PUT and not request.spans
    expected_pages = len(request.keys) if by_frames else 0
    if len(request.pages) != expected_pages:
        raise ValueError(f"{request.op} needs {expected_pages} pages, got {len(request.pages)}")
    if request.op is Op.PUT and request.spans and len(request.spans) != len(request.keys):
        raise ValueError(f"PUT needs {len(request.keys)} spans, got {len(request.spans)}")
    header: dict[str, object] = {"v": VERSION, "op": str(request.op), "id": request.id}
    if request.op in KEYED_OPS:
        header["keys"] = list(request.keys)
    if request.lease:
        header["lease"] = request.lease
    if request.spans:
        header["spans"] = [[span.offset, span.length] for span in request.spans]
    if request.put_bytes:
        header["put_bytes"] = request.put_bytes
    return [_pack(header), *request.pages]


def decode_request(frames: Sequence[Frame], limits: Limits) -> Request:
    """Check a received request against the protocol and ``limits``; raise ProtocolError."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty message")
    header = _unpack_header(frames[0], limits.max_header_bytes)
    request_id = _read_id(header.get("id"))
    try:
        op = _check_fields(header, request_id)
        keys = _check_keys(header.get("keys"), limits) if op in KEYED_OPS else ()
        pages = tuple(frames[1:])
        lease, spans, put_bytes = _check_shm_fields(header, op, keys, limits)
        _check_pages(op, keys, pages, limits, spans if op is Op.PUT else ())
    except ProtocolError as exc:
        exc.request_id = request_id
        raise
    assert request_id is not None  # _check_fields rejects a missing id
    return Request(op, request_id, keys, pages, lease, spans, put_bytes)


class _ShmFields(NamedTuple):
    lease: int
    spans: tuple[Span, ...]
    put_bytes: int


def _check_shm_fields(
    header: Mapping[str, object], op: Op, keys: tuple[bytes, ...], limits: Limits
) -> _ShmFields:
    """The shared-memory fields (absent: 0, (), 0); ignored, as unknown fields are, on
    ops that take none."""
    if op not in LEASE_OPS:
        return _ShmFields(0, (), 0)
    lease = _read_id(header.get("lease", 0))
    put_bytes = header.get("put_bytes", 0)
    if lease is None or not _is_int(put_bytes) or put_bytes < 0:  # type: ignore[operator]
        raise ProtocolError(ErrorCode.MALFORMED, "'lease' and 'put_bytes' must be ints >= 0")
    spans = (
        _spans(header.get("spans", []), limits.max_batch_keys)
        if op in (Op.PUT, Op.SHM_FREE)
        else ()
    )
    if not lease and (spans or op in UNANSWERED_OPS):
        raise ProtocolError(ErrorCode.MALFORMED, f"{op} with shared memory needs a 'lease'")
    if op is Op.PUT and spans and len(spans) != len(keys):
        raise ProtocolError(ErrorCode.BAD_FRAMES, f"PUT needs {len(keys)} spans, got {len(spans)}")
    return _ShmFields(lease, spans, int(put_bytes))  # type: ignore[call-overload]


def _spans(raw: object, max_count: int) -> tuple[Span, ...]:
    if not isinstance(raw, list) or len(raw) > max_count:
        raise ProtocolError(ErrorCode.MALFORMED, "'spans' must be a list of [offset, length]")
    spans = tuple(_span(item) for item in raw)
    if any(span is None for span in spans):
        raise ProtocolError(ErrorCode.MALFORMED, "each span must be [offset, length], ints >= 0")
    return spans  # type: ignore[return-value]


def _span(item: object) -> Span | None:
    if not isinstance(item, list) or len(item) != 2 or not all(_is_int(v) for v in item):
        return None
    return Span(item[0], item[1]) if item[0] >= 0 and item[1] >= 0 else None


def _check_fields(header: Mapping[str, object], request_id: int | None) -> Op:
    version = header.get("v")
    if not _is_int(version):
        raise ProtocolError(ErrorCode.MALFORMED, "'v' must be an int")
    if version != VERSION:
        raise ProtocolError(ErrorCode.BAD_VERSION, f"protocol version {version} != {VERSION}")
    if request_id is None:
        raise ProtocolError(ErrorCode.MALFORMED, "'id' must be an int in [0, 2**63)")
    op = header.get("op")
    if not isinstance(op, str):
        raise ProtocolError(ErrorCode.MALFORMED, "'op' must be a string")
    if op not in Op.__members__:
        raise ProtocolError(ErrorCode.BAD_OP, f"unknown op {op!r:.64}")
    return Op(op)


def _check_keys(raw: object, limits: Limits) -> tuple[bytes, ...]:
    if not isinstance(raw, list):
        raise ProtocolError(ErrorCode.MALFORMED, "'keys' must be a list of bytes")
    if len(raw) > limits.max_batch_keys:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"{len(raw)} keys > max_batch_keys {limits.max_batch_keys}"
        )
    for i, key in enumerate(raw):
        if not isinstance(key, bytes) or not key:
            raise ProtocolError(ErrorCode.MALFORMED, f"key {i} must be non-empty bytes")
        if len(key) > limits.max_key_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"key {i} has {len(key)} bytes > {limits.max_key_bytes}"
            )
    return tuple(raw)


def _check_pages(
    op: Op,
    keys: tuple[bytes, ...],
    pages: tuple[Frame, ...],
    limits: Limits,
    spans: tuple[Span, ...],
) -> None:
    """Payload frames (or a PUT's spans in shared memory) against the op and the limits."""
    expected = len(keys) if op is Op.PUT and not spans else 0
    if len(pages) != expected:
        raise ProtocolError(
            ErrorCode.BAD_FRAMES, f"{op} needs {expected} payload frames, got {len(pages)}"
        )
    total = 0
    for i, size in enumerate([len(page) for page in pages] or [span.length for span in spans]):
        if size > limits.max_page_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"page {i} has {size} bytes > {limits.max_page_bytes}"
            )
        total += size
    if total > limits.max_request_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"request of {total} bytes > {limits.max_request_bytes}"
        )


# --- replies ------------------------------------------------------------------------------


def encode_reply(reply: Reply) -> list[Frame]:
    """Frames of ``reply`` (header, then GET pages). ValueError if it is inconsistent."""
    header: dict[str, object] = {"v": VERSION, "id": reply.id, "ok": True}
    pages: tuple[Frame, ...] = ()
    if isinstance(reply, ErrorReply):
        header.update(ok=False, code=str(reply.code), message=reply.message)
    elif isinstance(reply, PingReply):
        header.update(pong=True, server=reply.server)
    elif isinstance(reply, ExistsReply):
        header["count"] = reply.count
    elif isinstance(reply, ContainsReply):
        header["present"] = list(reply.present)
    elif isinstance(reply, GetReply):
        if sum(reply.found) != len(reply.pages) + len(reply.spans) or (reply.pages and reply.spans):
            raise ValueError(f"{sum(reply.found)} keys found but {len(reply.pages)} pages")
        header["found"] = list(reply.found)
        if reply.spans:
            header["spans"] = [[span.offset, span.length] for span in reply.spans]
        pages = reply.pages
    elif isinstance(reply, ShmAttachReply):
        header.update(lease=reply.lease, path=reply.path, size=reply.size)
        header.update(put=[reply.put.offset, reply.put.length], expires_s=reply.expires_s)
    elif isinstance(reply, PutReply):
        header["stored"] = list(reply.stored)
    elif isinstance(reply, DeleteReply):
        header["deleted"] = reply.deleted
    else:
        header["stats"] = dict(reply.stats)
    return [_pack(header), *pages]


def decode_reply(frames: Sequence[Frame], op: Op) -> Reply:
    """Decode a reply to a request of ``op`` (the client knows it by id); raise ProtocolError."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty reply")
    header = _unpack_header(frames[0], max(len(frames[0]), 1))
    request_id = _read_id(header.get("id"))
    if header.get("v") != VERSION or (request_id is None and header.get("id") is not None):
        raise ProtocolError(ErrorCode.MALFORMED, "reply has a bad 'v' or 'id'")
    try:
        if header.get("ok") is False:
            return _error_reply(header, request_id)
        if header.get("ok") is not True or request_id is None:
            raise ProtocolError(ErrorCode.MALFORMED, "reply needs 'ok' and an 'id'")
        return _success_reply(header, request_id, op, tuple(frames[1:]))
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


def _error_reply(header: Mapping[str, object], request_id: int | None) -> ErrorReply:
    code, message = header.get("code"), header.get("message")
    if not isinstance(code, str) or code not in ErrorCode.__members__:
        raise ProtocolError(ErrorCode.MALFORMED, f"unknown error code {code!r:.64}")
    if not isinstance(message, str):
        raise ProtocolError(ErrorCode.MALFORMED, "error reply without a message")
    return ErrorReply(request_id, ErrorCode(code), message)


def _int_field(header: Mapping[str, object], name: str) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(ErrorCode.MALFORMED, f"reply field {name!r} is not an int >= 0")
    return value


def _bools(header: Mapping[str, object], name: str) -> tuple[bool, ...]:
    values = header.get(name)
    if not isinstance(values, list) or not all(isinstance(v, bool) for v in values):
        raise ProtocolError(ErrorCode.MALFORMED, f"reply field {name!r} must be a list of bools")
    return tuple(values)


def _stats(header: Mapping[str, object]) -> dict[str, StatValue]:
    stats = header.get("stats")
    if not isinstance(stats, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in stats.items()
    ):
        raise ProtocolError(ErrorCode.MALFORMED, "reply field 'stats' must map str to numbers")
    return stats


def _success_reply(
    header: Mapping[str, object], request_id: int, op: Op, pages: tuple[Frame, ...]
) -> Reply:
    if op is not Op.GET and pages:
        raise ProtocolError(ErrorCode.BAD_FRAMES, f"{op} reply with {len(pages)} payload frames")
    if op is Op.PING:
        server = header.get("server")
        if not isinstance(server, str):
            raise ProtocolError(ErrorCode.MALFORMED, "PING reply without a 'server' string")
        return PingReply(request_id, server)
    if op is Op.EXISTS:
        return ExistsReply(request_id, _int_field(header, "count"))
    if op is Op.CONTAINS:
        return ContainsReply(request_id, _bools(header, "present"))
    if op is Op.GET:
        found = _bools(header, "found")
        spans = _spans(header["spans"], len(found)) if "spans" in header else ()
        if sum(found) != len(pages) + len(spans) or (pages and spans):
            raise ProtocolError(
                ErrorCode.BAD_FRAMES, f"{sum(found)} keys found but {len(pages)} payload frames"
            )
        return GetReply(request_id, found, pages, spans)
    if op is Op.SHM_ATTACH:
        return _attach_reply(header, request_id)
    if op is Op.PUT:
        return PutReply(request_id, _bools(header, "stored"))
    if op is Op.DELETE:
        return DeleteReply(request_id, _int_field(header, "deleted"))
    return StatsReply(request_id, _stats(header))


def _attach_reply(header: Mapping[str, object], request_id: int) -> ShmAttachReply:
    path, expires_s, put = header.get("path"), header.get("expires_s"), _span(header.get("put"))
    if not isinstance(path, str) or not isinstance(expires_s, float) or put is None:
        raise ProtocolError(ErrorCode.MALFORMED, "SHM_ATTACH reply needs path, put, expires_s")
    lease, size = _int_field(header, "lease"), _int_field(header, "size")
    return ShmAttachReply(request_id, lease, path, size, put, expires_s)
