"""Golden values of what must never drift: the model fingerprint, page keys and the
page header, byte for byte, and the same vectors in docs/page-format.md.

A change here makes every existing store miss. If it is intended, bump
``FORMAT_VERSION`` (storage_backends/page_format.py), write the new vectors into
docs/page-format.md and replace the ones below in the same commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import xxhash

from hicache.config.cache import ModelConfig
from hicache.keys.hashing import LAYOUT_VERSION, model_fingerprint, page_keys
from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    Verdict,
    build_header,
    encode_page,
    validate,
)

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "page-format.md"
BUMP = "the page format changed: bump FORMAT_VERSION and update docs/page-format.md"

# The fixed inputs, every field spelled out (a changed default must not move them).
MODEL = ModelConfig(
    model_id="tiny-llama",
    num_layers=4,
    kv_heads=2,
    head_dim=32,
    dtype="float16",
    attention="mha",
    kv_lora_rank=0,
    rope_dim=0,
    tp_rank=0,
    tp_size=1,
)
PAGE_SIZE = 16
TOKENS = list(range(100_000, 100_048))  # three pages; ids over 16 bits show the byte order
NAMESPACE = "tenant-a"
PAYLOAD = bytes(range(256))

GOLDEN = {
    "fingerprint": "c9b5d2c6cc433da85ad559ab4140a27b414649f1504fc20f6d6dbf0a3919a46f",
    "key0": "00d8fc33c3151db70cfbba79a82280c3c44fa4a91690d8c60970ee8eb2350ef5",
    "key1": "57440eeff81c4d88deee9e417090692ef6361391f64697efe9c5b96a20602bb9",
    "key2": "cac42ae1d7ba716b90d571d946a01726e6ce83caf9907767c5397d5c67d65b44",
    "key0.tenant-a": "6c9503a1b57163354ac8d2f07026ed4150566c8fe5528466e207fb41158df38f",
    "key1.tenant-a": "ab794cda9cf076fa751fecb24f598d70f59bc059df47a3306b882ae48799f361",
    "key2.tenant-a": "1f10085bbf033dfa1569707aee1327b6a65b56f715c0cb0f9336a632c5626313",
    "payload.xxh3": "9408a4433b952d71",
    "header": (
        "484b5650" "0100" "0000"
        "00d8fc33c3151db70cfbba79a82280c3c44fa4a91690d8c60970ee8eb2350ef5"
        "0001000000000000" "712d953b43a40894"
    ),
}  # fmt: skip


def code_vectors() -> dict[str, str]:
    """The vectors as the code computes them now, by the names the doc uses."""
    fingerprint = model_fingerprint(MODEL, PAGE_SIZE)
    plain = page_keys(fingerprint, None, TOKENS, PAGE_SIZE)
    scoped = page_keys(fingerprint, NAMESPACE, TOKENS, PAGE_SIZE)
    header = build_header(plain[0], PAYLOAD)
    vectors = {"fingerprint": fingerprint.hex()}
    vectors |= {f"key{i}": key.hex() for i, key in enumerate(plain)}
    vectors |= {f"key{i}.{NAMESPACE}": key.hex() for i, key in enumerate(scoped)}
    vectors["payload.xxh3"] = f"{xxhash.xxh3_64_intdigest(PAYLOAD):016x}"
    vectors["header"] = header.hex()
    return vectors


def test_versions_are_the_ones_the_vectors_were_made_for() -> None:
    assert (FORMAT_VERSION, LAYOUT_VERSION) == (1, 1), (
        "a new format version needs new vectors: replace GOLDEN here and in docs/page-format.md"
    )


def test_fingerprint_is_pinned() -> None:
    assert code_vectors()["fingerprint"] == GOLDEN["fingerprint"], BUMP


@pytest.mark.parametrize("name", ["key0", "key1", "key2"])
@pytest.mark.parametrize("namespace", [None, NAMESPACE])
def test_page_keys_are_pinned(name: str, namespace: str | None) -> None:
    full = name if namespace is None else f"{name}.{namespace}"
    assert code_vectors()[full] == GOLDEN[full], BUMP


def test_page_header_is_pinned_byte_for_byte() -> None:
    vectors = code_vectors()
    assert vectors["payload.xxh3"] == GOLDEN["payload.xxh3"], "xxh3 of the payload changed"
    assert vectors["header"] == GOLDEN["header"], BUMP
    assert len(bytes.fromhex(GOLDEN["header"])) == HEADER_BYTES


def test_a_page_built_from_the_golden_header_reads_back() -> None:
    # What a client in another language writes from the doc: header bytes + payload.
    key = bytes.fromhex(GOLDEN["key0"])
    blob = bytes.fromhex(GOLDEN["header"]) + PAYLOAD
    assert blob == encode_page(key, PAYLOAD)
    assert validate(memoryview(blob), key, len(PAYLOAD)) is Verdict.OK


def doc_vectors() -> dict[str, str]:
    """``name = hex`` lines of the doc's ```text blocks."""
    blocks = re.findall(r"```text\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, f"{DOC.name} has no ```text block of vectors"
    pairs = re.findall(r"^([\w.-]+) = ([0-9a-f]+)$", "".join(blocks), re.M)
    return dict(pairs)


def test_the_doc_states_the_code_s_vectors() -> None:
    assert doc_vectors() == code_vectors()


def test_the_doc_states_the_current_versions() -> None:
    text = DOC.read_text()
    assert f"Format version: **{FORMAT_VERSION}**" in text
    assert f"key layout version: **{LAYOUT_VERSION}**" in text
