"""The KV event Structs of the installed vLLM and SGLang releases
(``requirements/engines.txt``), taken from their wheels' own source.

Importing ``vllm.distributed.kv_events`` or SGLang's module pulls in each
engine's whole runtime (GPU stacks, dozens of packages); so the module's
Struct and enum classes, its ``MEDIUM_*`` constants and the imports they need
are compiled from the installed file alone, unchanged. ``load`` returns None
when the release is not installed (``make test`` installs both).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

# package -> its KV event module, relative to the package folder
RELEASES = {"vllm": "distributed/kv_events.py", "sglang": "srt/disaggregation/kv_events.py"}
_IMPORTS = frozenset({"__future__", "typing", "enum", "msgspec"})
_BASES = ("msgspec.Struct", "enum.Enum")


def _wanted(node: ast.stmt, classes: set[str]) -> bool:
    """An import the event classes need, a ``MEDIUM_*`` constant, or an event class."""
    if isinstance(node, ast.Import):
        return all(a.name in _IMPORTS for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.module in _IMPORTS
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id.startswith("MEDIUM_") for t in node.targets)
    if isinstance(node, ast.ClassDef):
        return bool({ast.unparse(b) for b in node.bases} & {*_BASES, *classes})
    return False


def _kept(tree: ast.Module) -> list[ast.stmt]:
    classes: set[str] = set()
    body: list[ast.stmt] = []
    for node in tree.body:
        if _wanted(node, classes):
            body.append(node)
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
    return body


@functools.cache  # one module per release: msgspec resolves annotations by module name
def load(package: str) -> types.ModuleType | None:
    """The release's event classes as a module with ``VERSION`` and ``MEDIA`` (the
    medium names it declares); None when ``package`` is not installed."""
    spec = importlib.util.find_spec(package)  # locates the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / RELEASES[package]
    name = f"released_kv_events_{package}"
    module = types.ModuleType(name, f"{package} {path}")
    module.__dict__["ExternalBlockHash"] = bytes | int  # vLLM's alias (kv_cache_utils)
    sys.modules[name] = module  # msgspec resolves the annotations through it
    tree = ast.Module(body=_kept(ast.parse(path.read_text(), str(path))), type_ignores=[])
    exec(compile(tree, str(path), "exec"), module.__dict__)
    module.VERSION = importlib.metadata.version(package)  # type: ignore[attr-defined]
    medium = module.__dict__.get("StorageMedium")
    media = {m.value for m in medium} if medium else set()
    media |= {v for k, v in module.__dict__.items() if k.startswith("MEDIUM_")}
    module.MEDIA = media  # type: ignore[attr-defined]
    return module
