"""The layer map in docs/architecture.md against the real imports (read with ast).

Every import in the packages, at module level, inside a function or under
``TYPE_CHECKING``, must be one that the map allows: within the importing
module's row, or to a row listed in its "may import" column. The map itself
must run one way (no row allowed, through others, to import itself), and no
module-level import cycle may span two rows. ``python -m tests.test_layers``
prints the module-level import cycles.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("device_pool", "host_pool", "transfer", "storage_backends", "hicache")
BEGIN, END = "<!-- layers:begin", "<!-- layers:end -->"


class Import(NamedTuple):
    source: str  # the importing module
    target: str  # the module imported (the deepest one that exists)
    line: int
    top: bool  # runs at import time (module level, not under TYPE_CHECKING)


def read_map(text: str) -> dict[str, frozenset[str]]:
    """row -> the rows it may import, from the table between the layers markers."""
    table = text[text.index(BEGIN) : text.index(END)]
    rows: dict[str, frozenset[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        rows[cells[0].strip("`")] = frozenset(re.findall(r"`([\w.]+)`", cells[-1]))
    return rows


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the packages under ``root``."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join([*parts, base] if base else parts)
    for alias in node.names:  # `from pkg import mod` imports pkg.mod when it is a module
        yield f"{base}.{alias.name}"


def _walk(body: list[ast.stmt], top: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, top
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk(node.body, False)
            yield from _walk(node.orelse, top)
        else:  # a function's body runs when it is called, not at import
            deeper = top and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from _walk(
                [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)], deeper
            )


def imports(root: Path) -> list[Import]:
    """Every import between the packages' modules under ``root``."""
    known = modules(root)
    out = []
    for module, path in known.items():
        for node, top in _walk(ast.parse(path.read_text()).body, True):
            for name in _targets(node, module, path.name == "__init__.py"):
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    out.append(Import(module, name, node.lineno, top))
    return out


def row_of(module: str, rows: Mapping[str, object]) -> str | None:
    """The row a module belongs to: the longest row name that is it or a package above it."""
    found = [r for r in rows if module == r or module.startswith(r + ".")]
    return max(found, key=len) if found else None


def violations(root: Path, rows: Mapping[str, frozenset[str]]) -> list[str]:
    """Each import the map does not allow, as ``module:line -> target (row -> row)``."""
    out = []
    for imp in imports(root):
        source, target = row_of(imp.source, rows), row_of(imp.target, rows)
        if source != target and (source is None or target not in rows[source]):
            out.append(f"{imp.source}:{imp.line} -> {imp.target} ({source} -> {target})")
    return out


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None and child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child is not None:
                if child in stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def module_cycles(root: Path, top_only: bool) -> list[list[str]]:
    """Import cycles between modules (``top_only``: imports that run at import time)."""
    edges: dict[str, set[str]] = {m: set() for m in modules(root)}
    for imp in imports(root):
        if imp.top or not top_only:
            edges[imp.source].add(imp.target)
    return cycles(edges)


# One concept per module: a file past this many lines holds more than one (BRIEF, style 1).
MAX_LINES = 600
# Every Python file of the repository that the rule covers: the packages, their tests,
# the scripts, the examples and the docs' build hooks.
LINE_CHECKED = (*PACKAGES, "tests", "scripts", "examples", "docs")


def long_files(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: lines`` of each Python file under ``root``'s checked folders over ``limit``."""
    out = []
    for folder in LINE_CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > limit:
                out.append(f"{path.relative_to(root).as_posix()}: {lines}")
    return out


def _map() -> dict[str, frozenset[str]]:
    return read_map((REPO / "docs" / "architecture.md").read_text())


def test_every_import_is_one_the_layer_map_allows() -> None:
    assert violations(REPO, _map()) == []


def test_every_module_has_a_row_and_the_map_names_only_rows() -> None:
    rows = _map()
    assert [m for m in modules(REPO) if row_of(m, rows) is None] == []
    assert {r for allowed in rows.values() for r in allowed} - set(rows) == set()


def test_the_map_runs_one_way() -> None:
    rows = _map()
    assert cycles({row: set(allowed) for row, allowed in rows.items()}) == []


def test_no_import_cycle_spans_two_rows() -> None:
    rows = _map()
    for component in module_cycles(REPO, top_only=False):
        assert len({row_of(m, rows) for m in component}) == 1, component


def test_each_backend_and_each_benchmark_suite_is_a_row_of_its_own() -> None:
    """A sub-package of ``storage_backends`` or ``hicache.bench`` (a backend, the store tools, a
    suite, the benches' shared helpers) has its own row, so what it may import is written down."""
    rows = _map()
    for top in ("storage_backends", "hicache/bench"):
        for init in sorted((REPO / top).glob("*/__init__.py")):
            package = ".".join(init.parent.relative_to(REPO).parts)
            assert package in rows, f"{package} has no row in docs/architecture.md"


def test_no_import_cycle_among_the_benchmarks() -> None:
    """Not even through an import inside a function: a piece two bench modules share lives in a
    module below both (``tiering.serving``, ``storage.pages``, ``sglang.l3``, ``common``)."""
    cycles_ = module_cycles(REPO, top_only=False)
    found = [c for c in cycles_ if any(m.startswith("hicache.bench.") for m in c)]
    assert found == []


def test_an_upward_import_fails_the_check(tmp_path: Path) -> None:
    """The checker itself: a lower package importing a higher one is caught, in a
    function too; the same import the map allows passes."""
    for package, body in {
        "device_pool": "",
        "hicache": "",
        "host_pool": "def f():\n    from hicache import cache\n",
        "transfer": "",
        "storage_backends": "",
    }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(body)
    (tmp_path / "hicache" / "cache.py").write_text("import host_pool\n")
    rows = {"device_pool": frozenset(), "host_pool": frozenset(), "hicache": frozenset()}
    rows |= {"transfer": frozenset(), "storage_backends": frozenset()}
    found = violations(tmp_path, rows | {"hicache": frozenset({"host_pool"})})
    assert found == ["host_pool:2 -> hicache.cache (host_pool -> hicache)"]
    allowed = {"host_pool": frozenset({"hicache"}), "hicache": frozenset({"host_pool"})}
    assert violations(tmp_path, rows | allowed) == []
    assert module_cycles(tmp_path, top_only=False) == [["hicache.cache", "host_pool"]]
    assert module_cycles(tmp_path, top_only=True) == []


def test_no_module_is_over_600_lines() -> None:
    """Split a module that grows past it along a seam (a class per concern), as
    ``hicache/cache.py`` was into ``admission``, ``demotion``, ``factory`` and ``gauges``."""
    assert long_files(REPO) == []


def test_a_long_module_fails_the_line_check(tmp_path: Path) -> None:
    """The checker itself: a file one line over the limit is named, in a package or a
    test folder; one at the limit passes."""
    (tmp_path / "hicache" / "tiers").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "hicache" / "tiers" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "hicache" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "tests" / "test_big.py").write_text("\n" * (MAX_LINES + 5))
    over = [f"hicache/tiers/big.py: {MAX_LINES + 1}", f"tests/test_big.py: {MAX_LINES + 5}"]
    assert long_files(tmp_path) == over


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    for label, top_only in (("at import time", True), ("any import", False)):
        print(f"module import cycles ({label}):")
        for component in module_cycles(root, top_only):
            print(f"  {len(component)}: {' '.join(component)}")
