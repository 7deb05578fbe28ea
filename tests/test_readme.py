"""The README's embedding example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_opens_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    first_block = text.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


def test_readme_shows_the_embedding_example_as_it_is_in_examples() -> None:
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    example = (REPO / "examples" / "embed.py").read_text()
    assert code.group(1) in example and code.group(1).startswith("import torch")
    assert example.endswith(code.group(1))  # the README shows all of it but the docstring


def test_embedding_example_runs_from_any_directory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "embed.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "cached 96 tokens (100 asked; whole pages only)"


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_docs_link_nothing_outside_the_repository() -> None:
    for doc in DOCS:
        text = doc.read_text()
        assert not re.search(r"https?://", text), f"{doc.name} links outside the repository"
        assert "../" not in text, f"{doc.name} points above the repository"
        for target in re.findall(r"\]\(([^)]+)\)", text):
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(REPO) and path.exists(), f"{doc.name}: broken {target}"


def test_readme_config_table_is_generated_from_the_dataclasses() -> None:
    from hicache.config import doc as config_doc

    text = (REPO / "README.md").read_text()
    expected = config_doc.replace_all(text)
    assert text == expected, "run: python -m hicache.config.doc --write README.md"
    for table in config_doc.tables():
        assert table.begin in text and table.end in text


def test_every_config_key_is_explained() -> None:
    from hicache.config import doc as config_doc

    for table in config_doc.tables():
        missing = [d.key for d in config_doc.field_docs(table) if not d.meaning]
        assert missing == [], f"add these keys to hicache.config.doc's meanings: {missing}"
        stale = set(table.meanings) - set(config_doc.config_keys(table.cls))
        assert stale == set(), f"the meanings name keys that no longer exist: {stale}"


def test_config_table_shows_the_shipped_defaults() -> None:
    from hicache.config import doc as config_doc

    rows = {d.key: d for d in config_doc.field_docs()}
    # default.toml sets these differently from the dataclasses; both columns say so.
    assert rows["storage.backend"].shipped == "disk" and rows["storage.backend"].unset == "none"
    table = config_doc.markdown_table()
    assert '| `storage.backend` | `"disk"` | `"none"` |' in table
