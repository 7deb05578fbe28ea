"""The README is the front door: the two commands first, what hicache is, what each tier
buys, the embedding example (run as written), and links into the documentation site,
where everything else lives. Every command it shows runs; every link it has resolves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# A front door, not a manual: what does not fit belongs on a page of the site.
MAX_LINES = 150


def shell_commands(text: str) -> list[str]:
    """The commands of the ``sh`` blocks of ``text``, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    lines = (line.split("#")[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line]


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    title, first_block = text.split("```")[:2]
    assert title.strip() == "# hicache"  # nothing before the two commands but the title
    assert shell_commands(f"```{first_block}```") == ["make run", "make test"]


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES, "move what does not fit into a page of docs/"
    assert "make docs" in shell_commands(text)


def test_every_command_the_readme_shows_runs() -> None:
    """Each is a make target; ``make -n`` resolves it (and what it depends on) without
    running it: ``make run`` and ``make test`` themselves run in CI."""
    commands = shell_commands(README.read_text())
    assert commands and all(c.startswith("make ") for c in commands), commands
    targets = [c.split()[1] for c in commands]
    dry = subprocess.run(
        ["make", "-n", *targets], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr


def test_readme_links_pages_of_the_site() -> None:
    """A page the README links is one the site builds (in ``mkdocs.yml``'s nav)."""
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [t.split("#")[0] for t in re.findall(r"\]\((docs/[^)]+)\)", README.read_text())]
    assert len(pages) >= 10
    for page in pages:
        assert re.search(rf"\s{re.escape(page.removeprefix('docs/'))}\s", nav), page


def test_readme_shows_the_embedding_example_as_it_is_in_examples() -> None:
    text = README.read_text()
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


DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


def test_docs_link_nothing_outside_the_repository() -> None:
    for doc in DOCS:
        text = doc.read_text()
        assert not re.search(r"https?://", text), f"{doc.name} links outside the repository"
        assert "../" not in text, f"{doc.name} points above the repository"
        for target in re.findall(r"\]\(([^)]+)\)", text):
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(REPO) and path.exists(), f"{doc.name}: broken {target}"
