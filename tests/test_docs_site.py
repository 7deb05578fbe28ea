"""The documentation site builds, strict and offline, and its checks catch what they say.

``make docs`` runs the same build. MkDocs checks links and anchors; the hooks in
``docs/hooks/`` generate the reference pages from the code and check every config
key, module, path, command and make target a page names (``refs.py``), so a
rename breaks this test instead of a reader.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs mkdocs with every connection and name lookup beyond loopback refused: the
# build must need no network (no web fonts, no CDN, no plug-in that calls out).
OFFLINE_BUILD = """
import socket, sys
LOCAL = ("127.0.0.1", "::1", "localhost")
def refuse(host):
    raise OSError(f"the docs build tried to reach {host!r}: it must need no network")
real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOCAL:
        refuse(address[0])
    return real_connect(self, address)
def getaddrinfo(host, *args, **kwargs):
    if host not in LOCAL and host is not None:
        refuse(host)
    return real_getaddrinfo(host, *args, **kwargs)
socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
from mkdocs.__main__ import cli
cli.main(args=sys.argv[1:], prog_name="mkdocs")
"""
REMOTE_LOAD = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//"""
)


def refs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_refs", REPO / "docs" / "hooks" / "refs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make installs it)")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-c", OFFLINE_BUILD, "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=280,
    )
    said = [line for line in build.stderr.splitlines() if not line.startswith("INFO")]
    assert build.returncode == 0, "\n".join(said[-40:])
    return out


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    for page in ("index.html", "protocol.html", "architecture.html", "reference/cli.html"):
        assert page in pages
    for path in site.rglob("*.html"):
        found = REMOTE_LOAD.search(path.read_text())
        assert found is None, f"{path.name} loads {found.group(0)!r} from the network"


def test_the_reference_is_generated_from_the_code(site: Path) -> None:
    from hicache.bench import BENCHMARKS
    from hicache.config import doc

    cli = (site / "reference" / "cli.html").read_text()
    for name in BENCHMARKS:
        assert f'id="hicache-bench-{name}"' in cli
    assert 'id="python-m-hicacheengine"' in cli
    for table, page in zip(doc.tables(), ("config.html", "daemon-config.html"), strict=True):
        html = (site / "reference" / page).read_text()
        for key in doc.config_keys(table.cls):
            assert f'id="{key}"' in html, f"{key} has no row in {page}"
    api = (site / "reference" / "api.html").read_text()
    assert 'id="hicache.cache.HiRadixCache.match_prefix"' in api
    assert 'id="storage_backends.StorageBackend"' in api


# What refs.py must refuse: one planted mistake of each kind, in a page's own words.
PLANTED = {
    "a config key": "Set `storage.sink` to `full`.",
    "a config key with --set": "```sh\nhicache bench tiering --set host.ration=2\n```",
    "a key of a toml block": '```toml\n[storage]\nbackend = "disk"\nsinc = "full"\n```',
    "a module": "The daemon's readers live in `hicache.daemon.reader`.",
    "a class of a module": "See `hicache.integrations.vllm.HicacheTeir`.",
    "a method of a class": "Call `hicache.cache.HiRadixCache.match_prefx`.",
    "an import of a python block": "```python\nfrom hicache import HiRadixCach\n```",
    "a module path in a code block": '```json\n{"module_path": "hicache.integrations.vlm"}\n```',
    "a repository path": "Read `hicache/daemon/reader.py`.",
    "a command": "Run `hicache bench tierring`.",
    "an option of a command": "```sh\nhicache bench tiering --workloads longdoc\n```",
    "a choice of an option": "```sh\nhicache bench tiering --workload shortdoc\n```",
    "an option of a usage line": "```sh\nhicache bench vllm [--chunk-kib K] [--json PATH]\n```",
    "a python -m module": "```sh\npython -m hicache.engines --turns 2\n```",
    "an option of the engine": "```sh\npython -m hicache.engine --turn 2\n```",
    "a make target": "Then `make doc`.",
    "a link outside the repository": "See [MkDocs](https://www.mkdocs.org/).",
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_wrong_name_is_refused(kind: str) -> None:
    assert refs().problems(PLANTED[kind]) != [], f"refs.py let {kind} through"


def test_right_names_pass() -> None:
    text = """
`storage.sync`, `server.max_inflight_*`, `storage.backend = "disk"`, `hicache.HiRadixCache`,
`hicache.integrations.vllm:HicacheTier`, `hicache/daemon/readers.py`, `make docs`,
`hicache store migrate PATH`, `hicache --version`, `python -m hicache.engine`,
`hicache.storage_backends` (the entry-point group), `hicache storage namespace: m` (a log line).

```sh
hicache serve --config daemon --set store.sync=full   # a comment
HICACHE_PURE=1 python -m hicache.engine --evict cycle --turns 4 | grep TTFT
hicache bench vllm [--chunk-kb 1024] [--json PATH]
```
"""
    assert refs().problems(text) == []


def test_the_readme_names_only_what_exists() -> None:
    # Not part of the site, but it names keys, modules and commands the same way.
    assert refs().problems((REPO / "README.md").read_text()) == []


def test_the_pages_name_the_pinned_engine_releases() -> None:
    # The KV-event formats are decoded in make test with these releases' own Structs.
    lines = (REPO / "requirements" / "engines.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))
    events = (REPO / "docs" / "guide" / "events.md").read_text()
    for package, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        assert f"**{name} {pins[package]}**" in events


def test_the_cli_page_names_every_shipped_config_by_what_reads_it() -> None:
    from hicache.config.shipped import CACHE, DAEMON, shipped_configs

    text = " ".join((REPO / "docs" / "reference" / "cli.md").read_text().split())
    cache, daemon = shipped_configs(CACHE), shipped_configs(DAEMON)
    assert sorted(cache + daemon) == shipped_configs()
    assert "(shipped: " + ", ".join(f"`{n}`" for n in cache) + "; default `default`)" in text
    assert "(shipped: " + ", ".join(f"`{n}`" for n in daemon) + ")" in text
    assert "`keygen`, `store verify` and `store migrate` read no config" in text
