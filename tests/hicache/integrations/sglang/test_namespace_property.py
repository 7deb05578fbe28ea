"""The namespace the SGLang adapter builds from SGLang's config (``namespace_fields``),
as the module doc and docs/sglang.md promise it, for every config:

- the model, attention kind, dtype, layout, page size and page bytes always partition;
- the TP rank and size partition MHA pages; MLA ranks share pages (the rank does not
  count), except that with decode-context parallelism the TP size does;
- PP, attention-CP and DCP ranks partition only when their size is over 1; a size change
  always does;
- the same config gives the same keys (no process state).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.integrations.common import Namespace
from hicache.integrations.sglang import PageGeometry, namespace_fields

SIZES = st.sampled_from([1, 1, 2, 4])
RANKS = st.integers(0, 3)
CONFIG_FIELDS = {
    "model_name": st.sampled_from(["org/a", "org/b", ""]),
    "is_mla_model": st.booleans(),
    "tp_rank": RANKS,
    "tp_size": SIZES,
    "pp_rank": RANKS,
    "pp_size": SIZES,
    "attn_cp_rank": RANKS,
    "attn_cp_size": SIZES,
    "dcp_rank": RANKS,
    "dcp_size": SIZES,
}
GEOMETRY_FIELDS = {
    "page_size": st.sampled_from([1, 16, 64]),
    "nbytes": st.sampled_from([4096, 8192]),
    "dtype": st.sampled_from([torch.bfloat16, torch.float16, torch.float8_e4m3fn]),
    "layout": st.sampled_from(["page_first", "layer_first", "page_first_direct"]),
}
STRATEGIES = {**CONFIG_FIELDS, **GEOMETRY_FIELDS}


def _digest(config: dict[str, object], geometry: dict[str, object]) -> bytes:
    geom = PageGeometry(
        geometry["page_size"],  # type: ignore[arg-type]
        geometry["page_size"],  # type: ignore[arg-type]
        1024,
        geometry["nbytes"],  # type: ignore[arg-type]
        geometry["dtype"],  # type: ignore[arg-type]
        geometry["layout"],  # type: ignore[arg-type]
        True,
    )
    return Namespace.of(namespace_fields(SimpleNamespace(**config), geom)).digest  # type: ignore[arg-type]


def _partitions(name: str, config: dict[str, object]) -> bool:
    """Whether changing ``name`` (to a different value) must change the namespace."""
    mla = bool(config["is_mla_model"])
    if name == "tp_rank":
        return not mla
    if name == "tp_size":
        return not mla or int(config["dcp_size"]) > 1  # type: ignore[call-overload]
    for prefix in ("pp", "attn_cp", "dcp"):
        if name == f"{prefix}_rank":
            return int(config[f"{prefix}_size"]) > 1  # type: ignore[call-overload]
    return True  # model, attention kind, sizes, geometry


@settings(max_examples=300, deadline=None)
@given(
    config=st.fixed_dictionaries(CONFIG_FIELDS),
    geometry=st.fixed_dictionaries(GEOMETRY_FIELDS),
    name=st.sampled_from(sorted(STRATEGIES)),
    data=st.data(),
)
def test_a_field_partitions_pages_exactly_when_promised(
    config: dict[str, object], geometry: dict[str, object], name: str, data: st.DataObject
) -> None:
    before = _digest(config, geometry)
    assert _digest(dict(config), dict(geometry)) == before  # deterministic
    target = config if name in config else geometry
    new = data.draw(STRATEGIES[name].filter(lambda v: v != target[name]))
    changed = {**target, name: new}
    after = _digest(changed, geometry) if target is config else _digest(config, changed)
    assert (after != before) == _partitions(name, config), f"{name}: {target[name]} -> {new}"
