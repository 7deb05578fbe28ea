"""MkDocs hook: the generated parts of the site's pages, made at build time.

A page asks for one with an HTML comment on a line of its own (invisible where
the Markdown is read as it is, on a forge):

- ``<!-- generated: NAME -->``: one of ``GENERATORS`` below (the CLI from the
  real argparse parsers, the configuration keys from the config dataclasses,
  the benchmark list from the benchmark registry, the API directives from the
  packages' export lists);
- ``<!-- example: PATH -->``: the file at PATH (from the repository root) as a
  Python block, less its module docstring: the same code the tests run.

Nothing generated is committed, so nothing generated goes stale. An unknown
name or a missing file is a warning, which ``mkdocs build --strict`` makes an
error.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- (generated|example): (\S+) -->$", re.M)
# Benchmark suites whose page is not named after the suite.
BENCH_PAGES = {"sglang": "integrations.md", "vllm": "integrations.md"}
HELP_COLUMNS = "80"  # what the content column shows without scrolling

log = logging.getLogger("mkdocs.plugins.hicache.pages")


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    """argparse wraps help to the terminal's width: the same width on every machine."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


@functools.cache
def cli_reference() -> str:
    """Every command's ``--help``, from the parsers ``hicache`` itself builds."""
    from hicache.cli.app import build_parser
    from hicache.config.flags import build_all
    from hicache.engine.__main__ import build_parser as engine_parser

    parts = []
    with _columns(HELP_COLUMNS):
        commands = [*build_all(build_parser()), ("python -m hicache.engine", engine_parser())]
        for name, parser in commands:
            words = name.split()
            level = 2 if words[0] == "python" else 2 + min(len(words) - 1, 2)
            text = parser.format_help().rstrip()
            parts.append(f"{'#' * level} {name}\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


def config_reference(which: int) -> str:
    """The keys of the cache's (0) or the daemon's (1) config, a table per section; each
    key's row carries the key as its anchor (``config.md#storage.sync``)."""
    from hicache.config import doc

    table = doc.tables()[which]
    sections: dict[str, list[str]] = {}
    for key, row in doc.table_rows(table):
        anchored = row.replace(f"| `{key}` |", f'| <span id="{key}"></span>`{key}` |', 1)
        sections.setdefault(key.partition(".")[0], []).append(anchored)
    head = doc.table_head(table)
    return "\n".join(
        f"## `[{name}]`\n\n{head}\n" + "\n".join(rows) + "\n" for name, rows in sections.items()
    )


def bench_list() -> str:
    """One row per registered benchmark, linked to its section of the suite's page."""
    from hicache.bench import BENCHMARKS, summaries
    from hicache.config.flags import first_line

    rows = ["| benchmark | what it measures | needs | `--config` |", "| --- | --- | --- | --- |"]
    for name, text in summaries().items():
        bench = BENCHMARKS[name]
        suite = bench.module.split(".")[2]
        page = BENCH_PAGES.get(suite, f"{suite}.md")
        needs = ", ".join(f"`{m}`" for m in bench.extras) or "—"
        link = f"[`{name}`]({page}#hicache-bench-{name})"
        rows.append(f"| {link} | {first_line(text)} | {needs} | {bench.configs} |")
    return "\n".join(rows) + "\n"


def api_hicache() -> str:
    """mkdocstrings directives for the names ``import hicache`` exports."""
    import hicache

    exports: dict[str, str] = hicache._EXPORTS  # name -> module, the lazy export map
    return "\n".join(f"::: {module}.{name}\n" for name, module in exports.items())


def api_storage() -> str:
    """mkdocstrings directives for ``storage_backends.__all__`` (classes and functions)."""
    import storage_backends

    names = [n for n in storage_backends.__all__ if callable(getattr(storage_backends, n))]
    return "\n".join(f"::: storage_backends.{name}\n" for name in names)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "config": lambda: config_reference(0),
    "daemon-config": lambda: config_reference(1),
    "benchmarks": bench_list,
    "api-hicache": api_hicache,
    "api-storage": api_storage,
}


def example(path: str) -> str:
    """The example file as a Python block, less its module docstring."""
    file = REPO / path
    text = file.read_text()
    tree = ast.parse(text)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        text = "\n".join(text.splitlines()[first.end_lineno or 0 :])
    return f"```python\n{text.strip()}\n```"


def expand(markdown: str, where: str) -> str:
    """``markdown`` with every marker replaced; a bad marker is logged and left as it is."""

    def replace(m: re.Match[str]) -> str:
        kind, name = m.group(1), m.group(2)
        if kind == "example":
            if not (REPO / name).is_file():
                log.warning("%s: example %s: no such file", where, name)
                return m.group(0)
            return example(name)
        generator = GENERATORS.get(name)
        if generator is None:
            log.warning("%s: unknown generated part %r; known: %s", where, name, sorted(GENERATORS))
            return m.group(0)
        return generator()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    where = getattr(getattr(page, "file", None), "src_uri", "?")
    return expand(markdown, where)
