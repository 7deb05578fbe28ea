"""hicache.config.doc: the configuration tables the site's reference pages show."""

from __future__ import annotations

from hicache.config import doc as config_doc


def test_every_config_key_is_explained() -> None:
    for table in config_doc.tables():
        missing = [d.key for d in config_doc.field_docs(table) if not d.meaning]
        assert missing == [], f"add these keys to hicache.config.doc's meanings: {missing}"
        stale = set(table.meanings) - set(config_doc.config_keys(table.cls))
        assert stale == set(), f"the meanings name keys that no longer exist: {stale}"


def test_config_table_shows_the_shipped_defaults() -> None:
    rows = {d.key: d for d in config_doc.field_docs()}
    # default.toml sets these differently from the dataclasses; both columns say so.
    assert rows["storage.backend"].shipped == "disk" and rows["storage.backend"].unset == "none"
    table = config_doc.markdown_table()
    assert '| `storage.backend` | `"disk"` | `"none"` |' in table


def test_the_module_prints_both_tables(capsys) -> None:
    assert config_doc.main([]) == 0
    out = capsys.readouterr().out
    assert "| `storage.sync` |" in out and "| `store.sync` |" in out
