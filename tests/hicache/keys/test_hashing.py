from __future__ import annotations

import subprocess
import sys

import pytest

from hicache.config.cache import ModelConfig
from hicache.keys.hashing import model_fingerprint, page_keys


def test_keys_chain_and_partition() -> None:
    fp = model_fingerprint(ModelConfig(), 4)
    toks = list(range(12))
    keys = page_keys(fp, None, toks, 4)
    assert len(keys) == 3 and all(len(k) == 32 for k in keys)
    # Chaining: the second page's key depends on the first page.
    assert page_keys(keys[0], None, toks[4:], 4) == keys[1:]
    other = page_keys(fp, None, [99, *toks[1:]], 4)
    assert other[0] != keys[0] and other[1] != keys[1]
    assert page_keys(fp, "tenant-a", toks, 4) != keys
    assert page_keys(fp, "", toks, 4) != keys
    assert page_keys(fp, "a", toks, 4) != page_keys(fp, "b", toks, 4)


def test_fingerprint_changes_with_model_and_page_size() -> None:
    base = model_fingerprint(ModelConfig(), 16)
    assert model_fingerprint(ModelConfig(), 16) == base
    assert model_fingerprint(ModelConfig(), 64) != base
    assert model_fingerprint(ModelConfig(dtype="bfloat16"), 16) != base
    assert model_fingerprint(ModelConfig(tp_size=2), 16) != base


def test_partial_page_rejected() -> None:
    with pytest.raises(ValueError):
        page_keys(b"x" * 32, None, [1, 2, 3], 2)


def test_keys_equal_across_processes() -> None:
    code = (
        "from hicache.config.cache import ModelConfig;"
        "from hicache.keys.hashing import model_fingerprint, page_keys;"
        "fp = model_fingerprint(ModelConfig(), 16);"
        "print(page_keys(fp, 'ns', list(range(1000, 1064)), 16)[-1].hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    fp = model_fingerprint(ModelConfig(), 16)
    assert out.stdout.strip() == page_keys(fp, "ns", list(range(1000, 1064)), 16)[-1].hex()
