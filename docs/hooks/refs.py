"""MkDocs hook: every name a page gives must exist, so that a rename breaks the build.

MkDocs itself checks the links between pages and their anchors. This hook
checks what a reader types or looks up from a page (``problems`` lists them;
each is a warning, an error under ``mkdocs build --strict``):

- a config key in inline code (`` `storage.sync` ``, `` `server.max_inflight_*` ``),
  after ``--set`` / ``--daemon-set`` in a code block, or as a key of a ``toml``
  block: a key of the cache's or the daemon's config dataclasses;
- a module or object of the project (`` `hicache.integrations.vllm` ``,
  `` `storage_backends.lmdb.check` ``, ``HicacheTier`` after it, ``module:Class``),
  in inline code, in a Python block's imports or a code block's text: a module
  file in the repository, and the names after it defined there;
- a repository path in inline code (`` `hicache/daemon/readers.py` ``): it exists;
- a link: none leaves the repository (no ``http(s)://`` links);
- a command: ``hicache ...`` lines of shell blocks parse with the real parser,
  ``--set`` keys included; in inline code its sub-command path exists;
  ``python -m MODULE`` names a module; ``make TARGET`` a target of the Makefile.

It reads the page after ``pages.py`` has filled in its generated parts.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import logging
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hicache", "storage_backends", "device_pool", "host_pool", "transfer")
TOP_DIRS = (*PACKAGES, "configs", "tests", "examples", "scripts", "docs", "requirements")
SHELLS = ("", "sh", "bash", "shell", "console")

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*\n"
                   r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)  # fmt: skip
INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
MODULE = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)+(?::\w+)?$")
# In a code block's text (``"module_path": "hicache.integrations.vllm"``); not after a
# slash or a dot (``ipc:///tmp/hicache.sock``), and not ``transfer.``: a config section too.
IN_CODE_MODULE = re.compile(
    r"(?<![\w/.-])(?:hicache|storage_backends|device_pool|host_pool)(?:\.\w+)+"
)
PATH = re.compile(rf"^(?:{'|'.join(TOP_DIRS)})/[\w./-]*(?:::\w+)?$")
OUTSIDE = re.compile(r"\]\((https?://[^)\s]+)|<(https?://[^>\s]+)>")
SET_FLAG = re.compile(r"--(?:daemon-)?set[ =]([a-z_]+\.[a-z_]+)=")

log = logging.getLogger("mkdocs.plugins.hicache.refs")


@functools.cache
def config_keys() -> frozenset[str]:
    """Every ``section.key`` of the cache's and the daemon's configs."""
    from hicache.config import doc

    return frozenset(k for t in doc.tables() for k in doc.config_keys(t.cls))


@functools.cache
def sections() -> frozenset[str]:
    return frozenset(k.partition(".")[0] for k in config_keys())


def check_key(key: str) -> str | None:
    """A problem with config key ``key`` (``*`` at the end: a prefix), or None."""
    if key.endswith("*"):
        if any(k.startswith(key[:-1]) for k in config_keys()):
            return None
    elif key in config_keys():
        return None
    return f"config key `{key}` does not exist"


def _looks_like_key(text: str) -> str | None:
    """The config key an inline code span names (`storage.sync`, `storage.sync = "full"`)."""
    m = re.fullmatch(r"([a-z_]+)\.([a-z_]+\*?)(?:\s*=.*)?", text)
    if m is None or m.group(1) not in sections():
        return None
    if re.search(r"\.(py|pyx|toml|md|json|key)$", text):
        return None  # a file name
    return f"{m.group(1)}.{m.group(2)}"


# Modules and the names they define ------------------------------------------------


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body defines (classes, functions, assignments, imports)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            exports = any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
            if exports and isinstance(node.value, ast.Dict):  # a lazy export map
                names |= {
                    k.value
                    for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try):
            names |= _defined(node.body)
    return names


@functools.cache
def entry_point_groups() -> frozenset[str]:
    """The entry-point groups plug-ins register under (``hicache.storage_backends``)."""
    text = (REPO / "storage_backends" / "plugins.py").read_text()
    return frozenset(re.findall(r'^ENTRY_POINT_GROUP = "([^"]+)"', text, re.M))


def check_module(dotted: str) -> str | None:
    """A problem with ``pkg.module[.Name[.attr]]`` (or ``pkg.module:Name``), or None."""
    if dotted in entry_point_groups():
        return None
    parts = dotted.replace(":", ".").split(".")
    for i in range(len(parts), 0, -1):
        path = _module_file(parts[:i])
        if path is not None:
            break
    else:
        return f"module `{dotted}` does not exist"
    body, scope, bases = _tree(path).body, ".".join(parts[:i]), False
    for name in parts[i:]:
        names = _defined(body)
        if scope == ".".join(parts[:i]) and "__getattr__" in names and "_EXPORTS" not in names:
            return None  # a module that makes its names on first use: not checked
        if name not in names:
            return None if bases else f"`{dotted}`: `{scope}` has no `{name}`"  # or inherited
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == name]
        if not classes:
            return None  # a function, an assignment or an import: not followed
        body, scope, bases = classes[0].body, f"{scope}.{name}", bool(classes[0].bases)
    return None


def check_path(text: str) -> str | None:
    path = text.split("::")[0]
    if any(c in path for c in "<>*{}"):
        return None
    return None if (REPO / path).exists() else f"path `{path}` does not exist"


# Commands ----------------------------------------------------------------------------


@functools.cache
def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    from hicache.cli.app import build_parser
    from hicache.engine.__main__ import build_parser as engine_parser

    return build_parser(), engine_parser()


@functools.cache
def command_paths() -> frozenset[tuple[str, ...]]:
    """Every command path of ``hicache`` (``("bench", "tiering")``, ``("store",)``, ...)."""
    from hicache.cli.app import build_parser
    from hicache.config.flags import build_all

    return frozenset(tuple(name.split()[1:]) for name, _ in build_all(build_parser()))


@functools.cache
def make_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    targets = re.findall(r"^([A-Za-z0-9_./$()-][^:=\n]*?):(?!=)", text, re.M)
    return frozenset(t for group in targets for t in group.split())


def check_make(words: list[str]) -> str | None:
    for target in words:
        if "=" in target or target.startswith("-") or target.isupper():
            continue
        if target not in make_targets():
            return f"`make {target}`: no such target in the Makefile"
    return None


def check_command_path(words: list[str]) -> str | None:
    """``hicache`` followed by ``words``: the sub-commands named exist."""
    path: tuple[str, ...] = ()
    for word in words:
        if not _has_children(path) or not re.fullmatch(r"[a-z][a-z-]*", word):
            break  # a leaf's arguments, an option or a placeholder
        if (*path, word) not in command_paths():
            return f"`hicache {' '.join((*path, word))}`: no such command"
        path = (*path, word)
    return None


def _has_children(path: tuple[str, ...]) -> bool:
    return any(len(p) == len(path) + 1 and p[: len(path)] == path for p in command_paths())


def _parse(parser: argparse.ArgumentParser, argv: list[str], shown: str) -> str | None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:
            if e.code in (0, None):
                return None  # --help
            message = err.getvalue().strip().splitlines()
            return f"`{shown}` does not parse: {message[-1] if message else e.code}"
    if hasattr(args, "config"):
        from hicache.config.flags import check_override_keys

        try:
            check_override_keys(args)
        except ValueError as e:
            return f"`{shown}`: {e}"
    return None


def check_synopsis(words: list[str], shown: str) -> str | None:
    """A usage line (``hicache bench vllm [--chunks N] [--json PATH]``): the command
    exists and has every option the line shows."""
    path = tuple(w for w in words if re.fullmatch(r"[a-z][a-z-]*", w))
    while path and path not in command_paths():
        path = path[:-1]
    problem = check_command_path(list(path))
    if problem:
        return problem
    from hicache.config.flags import build_all

    parser = dict(build_all(_parsers()[0]))[" ".join(("hicache", *path))]
    known = {s for a in parser._actions for s in a.option_strings}
    for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", shown):
        if option not in known:
            return f"`{shown}`: `hicache {' '.join(path)}` has no option {option}"
    return None


def check_command(words: list[str], shown: str) -> str | None:
    """One command line of a shell block, split into words."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return None
    hicache, engine = _parsers()
    if words[0] == "hicache" and "[" in shown:
        return check_synopsis(words[1:], shown)
    if words[0] == "hicache":
        return _parse(hicache, words[1:], shown)
    if words[0] == "make":
        return check_make(words[1:])
    if words[0].startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        module = words[2]
        if module.split(".")[0] not in PACKAGES:
            return None
        if _module_file(module.split(".")) is None:
            return f"`python -m {module}`: no such module"
        if module == "hicache.engine":
            return _parse(engine, words[3:], shown)
    return None


def shell_lines(body: str) -> Iterator[tuple[str, list[str]]]:
    """``(shown, words)`` for each command of a shell block (continuations joined,
    comments, prompts and everything after a pipe or ``&&`` dropped)."""
    for line in body.replace("\\\n", " ").splitlines():
        shown = line.strip().removeprefix("$ ")
        try:
            words = shlex.split(shown, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word in ("|", "||", "&&", ";", ">", ">>", "2>&1", "&"):
                words = words[:i]
                break
        if words:
            yield shown.split("  #")[0].strip(), words


# Pages ---------------------------------------------------------------------------------


def check_inline(text: str) -> str | None:
    text = text.strip().replace("\\|", "|")
    key = _looks_like_key(text)
    if key is not None:
        problem = check_key(key)
        if problem is None or not MODULE.match(text):
            return problem
    if MODULE.match(text):
        return check_module(text)
    if PATH.match(text):
        return check_path(text)
    words = text.split()
    if words[:1] == ["hicache"] and ": " not in text:  # with ": ", a log line
        return check_command_path(words[1:])
    if words[:1] == ["make"] and len(words) == 2:
        return check_make(words[1:])
    if words[:2] == ["python", "-m"] and len(words) > 2 and MODULE.match(words[2]):
        return check_module(words[2])
    return None


def check_toml(body: str) -> list[str]:
    try:
        data = tomllib.loads(body)
    except tomllib.TOMLDecodeError as e:
        return [f"a toml block does not parse: {e}"]
    out = []
    for section, table in data.items():
        if section not in sections() or not isinstance(table, dict):
            continue
        for name, value in table.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                continue  # an array of tables ([[auth.tenants]]): checked as one key
            problem = check_key(f"{section}.{name}")
            if problem:
                out.append(problem)
    return out


def check_block(lang: str, body: str) -> list[str]:
    out: list[str] = []
    if lang == "toml":
        out += check_toml(body)
    if lang == "python":
        out += check_python(body)
    if lang in SHELLS:
        for shown, words in shell_lines(body):
            problem = check_command(words, shown)
            if problem:
                out.append(problem)
    keys = [k for k in SET_FLAG.findall(body) if k != "section.key"]  # not the placeholder
    out += [p for k in keys if (p := check_key(k))]
    if lang != "python":
        out += [p for m in IN_CODE_MODULE.findall(body) if (p := check_module(m))]
    return out


def check_python(body: str) -> list[str]:
    try:
        tree = ast.parse(body)
    except SyntaxError as e:
        return [f"a python block does not parse: {e}"]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES and (problem := check_module(name)):
                out.append(problem)
    return out


def problems(markdown: str) -> list[str]:
    """Every name in ``markdown`` that does not exist, as a sentence each."""
    out: list[str] = []
    for m in FENCE.finditer(markdown):
        body = re.sub(rf"^{re.escape(m['indent'])}", "", m["body"], flags=re.M)
        out += check_block(m["lang"], body)
    prose = FENCE.sub("", markdown)
    for m in OUTSIDE.finditer(prose):
        out.append(f"{m.group(1) or m.group(2)}: the pages link nothing outside the repository")
    for m in INLINE.finditer(prose):
        problem = check_inline(m.group(2))
        if problem:
            out.append(problem)
    return sorted(set(out))


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    where = getattr(getattr(page, "file", None), "src_uri", "?")
    for problem in problems(markdown):
        log.warning("%s: %s", where, problem)
    return markdown
