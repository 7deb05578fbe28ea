"""The README's embedding example runs as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_opens_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    first_block = text.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


def test_readme_example_runs() -> None:
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    cwd = os.getcwd()
    os.chdir(REPO)  # the example names configs/ relative to the repository
    try:
        scope: dict[str, object] = {}
        exec(compile(code.group(1), "README.md", "exec"), scope)
    finally:
        os.chdir(cwd)
    cache = scope["cache"]
    cache.check_integrity()  # type: ignore[attr-defined]
    assert cache.evictable_size() == 96  # type: ignore[attr-defined]
