"""The wire protocol: round trips, every error code, limits, and fuzzed frames."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_backends.remote.protocol import (
    DeleteReply,
    ErrorCode,
    ErrorReply,
    ExistsReply,
    GetReply,
    Limits,
    Op,
    PingReply,
    ProtocolError,
    PutReply,
    Request,
    StatsReply,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)

LIMITS = Limits(max_batch_keys=8, max_key_bytes=16, max_page_bytes=64, max_request_bytes=128)


def _raw(header: object, *pages: bytes) -> list[bytes]:
    return [msgpack.packb(header, use_bin_type=True), *pages]


def _code(frames: list[bytes]) -> tuple[ErrorCode, int | None]:
    with pytest.raises(ProtocolError) as info:
        decode_request(frames, LIMITS)
    return info.value.code, info.value.request_id


@pytest.mark.parametrize(
    "request_",
    [
        Request(Op.PING, 0),
        Request(Op.STATS, 2**63 - 1),
        Request(Op.EXISTS, 5, (b"a", b"b" * 16)),
        Request(Op.GET, 6, (b"k",)),
        Request(Op.PUT, 7, (b"k1", b"k2"), (b"x" * 64, b"")),
        Request(Op.DELETE, 8, ()),
    ],
)
def test_request_round_trip(request_: Request) -> None:
    assert decode_request(encode_request(request_), LIMITS) == request_


@pytest.mark.parametrize(
    "reply,op",
    [
        (PingReply(1, "hicache 0.1"), Op.PING),
        (ExistsReply(2, 3), Op.EXISTS),
        (GetReply(3, (True, False, True), (b"p1", b"p3")), Op.GET),
        (PutReply(4, (True, False)), Op.PUT),
        (DeleteReply(5, 1), Op.DELETE),
        (StatsReply(6, {"hits": 3, "ratio": 0.5}), Op.STATS),
        (ErrorReply(None, ErrorCode.MALFORMED, "bad"), Op.GET),
        (ErrorReply(7, ErrorCode.BUSY, "later"), Op.PUT),
    ],
)
def test_reply_round_trip(reply: object, op: Op) -> None:
    assert decode_reply(encode_reply(reply), op) == reply  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "frames,code,request_id",
    [
        ([b"\xc1"], ErrorCode.MALFORMED, None),  # never-used msgpack byte
        ([msgpack.packb([1, 2])], ErrorCode.MALFORMED, None),
        ([msgpack.packb({"v": 1, "op": "PING", "id": 1}) + b"\x00"], ErrorCode.MALFORMED, None),
        (_raw({1: 2}), ErrorCode.MALFORMED, None),
        (_raw({"v": 2, "op": "PING", "id": 3}), ErrorCode.BAD_VERSION, 3),
        (_raw({"v": "1", "op": "PING", "id": 3}), ErrorCode.MALFORMED, 3),
        (_raw({"v": 1, "op": "PING", "id": -1}), ErrorCode.MALFORMED, None),
        (_raw({"v": 1, "op": "PING", "id": 2**63}), ErrorCode.MALFORMED, None),
        (_raw({"v": 1, "op": "PING", "id": True}), ErrorCode.MALFORMED, None),
        (_raw({"v": 1, "op": "PING"}), ErrorCode.MALFORMED, None),
        (_raw({"v": 1, "op": "FLUSH", "id": 4}), ErrorCode.BAD_OP, 4),
        (_raw({"v": 1, "op": b"PING", "id": 4}), ErrorCode.MALFORMED, 4),
        (_raw({"v": 1, "op": "GET", "id": 5}), ErrorCode.MALFORMED, 5),
        (_raw({"v": 1, "op": "GET", "id": 5, "keys": ["k"]}), ErrorCode.MALFORMED, 5),
        (_raw({"v": 1, "op": "GET", "id": 5, "keys": [b""]}), ErrorCode.MALFORMED, 5),
        (_raw({"v": 1, "op": "GET", "id": 5, "keys": [b"k" * 17]}), ErrorCode.TOO_LARGE, 5),
        (_raw({"v": 1, "op": "GET", "id": 5, "keys": [b"k"] * 9}), ErrorCode.TOO_LARGE, 5),
        (_raw({"v": 1, "op": "GET", "id": 6, "keys": [b"k"]}, b"p"), ErrorCode.BAD_FRAMES, 6),
        (_raw({"v": 1, "op": "PING", "id": 6}, b"p"), ErrorCode.BAD_FRAMES, 6),
        (_raw({"v": 1, "op": "PUT", "id": 7, "keys": [b"a", b"b"]}, b"p"), ErrorCode.BAD_FRAMES, 7),
        (_raw({"v": 1, "op": "PUT", "id": 8, "keys": [b"a"]}, b"p" * 65), ErrorCode.TOO_LARGE, 8),
        (
            _raw({"v": 1, "op": "PUT", "id": 9, "keys": [b"a", b"b", b"c"]}, *[b"p" * 60] * 3),
            ErrorCode.TOO_LARGE,
            9,
        ),
        ([b"\x92" + b"\xc4\x01a" * 3000], ErrorCode.TOO_LARGE, None),  # header over its cap
        ([], ErrorCode.MALFORMED, None),
    ],
)
def test_bad_requests_get_their_code(
    frames: list[bytes], code: ErrorCode, request_id: int | None
) -> None:
    assert _code(frames) == (code, request_id)


def test_huge_declared_counts_are_malformed_not_allocated() -> None:
    # array32 / map32 / bin32 headers claiming 4 G entries with no data behind them.
    for prefix in (b"\xdd", b"\xdf", b"\xc6"):
        assert _code([prefix + b"\xff\xff\xff\xff"])[0] is ErrorCode.MALFORMED


def test_unknown_header_fields_are_ignored() -> None:
    frames = _raw({"v": 1, "op": "EXISTS", "id": 1, "keys": [b"k"], "namespace": "x"})
    assert decode_request(frames, LIMITS) == Request(Op.EXISTS, 1, (b"k",))


def test_encode_rejects_inconsistent_records() -> None:
    with pytest.raises(ValueError):
        encode_request(Request(Op.PUT, 1, (b"k",), ()))
    with pytest.raises(ValueError):
        encode_request(Request(Op.PING, -1))
    with pytest.raises(ValueError):
        encode_reply(GetReply(1, (True,), ()))


@pytest.mark.parametrize(
    "header,pages,op",
    [
        ({"v": 1, "id": 1, "ok": True, "found": [True]}, (), Op.GET),
        ({"v": 1, "id": 1, "ok": True, "found": [1]}, (b"p",), Op.GET),
        ({"v": 1, "id": 1, "ok": True, "count": -1}, (), Op.EXISTS),
        ({"v": 1, "id": 1, "ok": True}, (b"p",), Op.PING),
        ({"v": 1, "id": 1, "ok": False, "code": "NOPE", "message": ""}, (), Op.PING),
        ({"v": 1, "id": None, "ok": True, "pong": True, "server": "s"}, (), Op.PING),
        ({"v": 2, "id": 1, "ok": True, "pong": True, "server": "s"}, (), Op.PING),
        ({"v": 1, "id": 1, "ok": True, "stats": {"a": "b"}}, (), Op.STATS),
    ],
)
def test_bad_replies_raise(header: dict[str, object], pages: tuple[bytes, ...], op: Op) -> None:
    with pytest.raises(ProtocolError):
        decode_reply(_raw(header, *pages), op)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        Limits(max_batch_keys=0)
    with pytest.raises(ValueError):
        Limits(max_page_bytes=10, max_request_bytes=5)
    assert Limits().max_frame_bytes >= Limits().max_page_bytes


_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_leaf = st.none() | st.booleans() | _ints | st.floats() | st.text(max_size=8)
_values = st.recursive(
    _leaf | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=10) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)
_headers = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 1, 1, 0, 2, "1"]),
        "op": st.sampled_from([*Op, "NOPE", b"GET", 3]),
        "id": st.integers(min_value=-2, max_value=2**64 - 1) | _values,
        "keys": st.lists(st.binary(max_size=20), max_size=12) | _values,
    },
)


@settings(max_examples=200, deadline=None)
@given(
    header=_headers | _values,
    pages=st.lists(st.binary(max_size=80), max_size=4),
    mutation=st.none() | st.tuples(st.integers(0, 200), st.integers(0, 255)),
)
def test_fuzzed_requests_decode_or_raise_protocol_error(
    header: object, pages: list[bytes], mutation: tuple[int, int] | None
) -> None:
    frame = bytearray(msgpack.packb(header, use_bin_type=True))
    if mutation is not None and frame:
        frame[mutation[0] % len(frame)] = mutation[1]
    try:
        request = decode_request([bytes(frame), *pages], LIMITS)
    except ProtocolError as exc:
        assert exc.code in ErrorCode
        return
    assert len(request.keys) <= LIMITS.max_batch_keys
    assert len(request.pages) == (len(request.keys) if request.op is Op.PUT else 0)
