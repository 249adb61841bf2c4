"""The store's tables are declared once (`telemetry.store.columns`): the schema derived from them is
version 4's as it was written out by hand, and a column added in a later version can be added to
an older store (ALTER TABLE appends) so that it ends where a new store has it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from telemetry.store.columns import BASE_VERSION, SCHEMA_VERSION, TABLES
from telemetry.store.schema import SCHEMA, connect

V4_SCHEMA = (Path(__file__).parent / "schema_v4.sql").read_text()  # version 4's schema as it was written by hand


def _layout(db: sqlite3.Connection) -> dict[str, Any]:
    """Each table's columns (name, type, not null, default, key) and every index's definition."""
    tables = {table.name: db.execute(f"PRAGMA table_info({table.name})").fetchall() for table in TABLES}
    indexes = sorted(db.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' "
                                "AND name NOT LIKE 'sqlite_%'").fetchall())
    return {"tables": tables, "indexes": indexes}


def test_the_derived_schema_is_version_4s_with_the_later_versions_columns(tmp_path: Path) -> None:
    written = sqlite3.connect(tmp_path / "v4.sqlite3", isolation_level=None)
    written.executescript(f"{V4_SCHEMA}\nPRAGMA user_version = 4;")
    # Version 5 added the upstream of each model turn (issue 55), and where its call fell back from.
    written.executescript("ALTER TABLE model_turns ADD COLUMN upstream TEXT;"
                          "ALTER TABLE model_turns ADD COLUMN fallback_from TEXT;")
    # Version 6 added what guardrails decided on each tool call (issue 59).
    written.executescript("ALTER TABLE tool_calls ADD COLUMN guardrail TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN guardrail_decision TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN guardrail_reason TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN guardrail_moment TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN guardrails TEXT;")
    # Version 7 added the aliases and repairs of each tool call, and the tools each model turn offered
    # (issue 61).
    written.executescript("ALTER TABLE tool_calls ADD COLUMN aliases TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN repair_mode TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN repair_changes TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN repair_before TEXT;"
                          "ALTER TABLE tool_calls ADD COLUMN repair_after TEXT;"
                          "ALTER TABLE model_turns ADD COLUMN tool_definitions TEXT;")
    expected = _layout(written)
    written.close()
    fresh = sqlite3.connect(":memory:", isolation_level=None)
    fresh.executescript(SCHEMA)
    assert _layout(fresh) == expected
    assert _layout(connect(str(tmp_path / "new.sqlite3"))) == expected
    older = sqlite3.connect(tmp_path / "old.sqlite3", isolation_level=None)
    older.executescript(f"{V4_SCHEMA}\nPRAGMA user_version = 4;")
    older.close()
    migrated = connect(str(tmp_path / "old.sqlite3"))  # a version 4 store gains the columns
    assert _layout(migrated) == expected
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)


def test_a_later_versions_columns_come_last_and_can_be_added_to_an_older_store() -> None:
    """A migration adds a later version's columns with ALTER TABLE, which appends them, and cannot
    add a NOT NULL column without a default nor a key: declared anywhere else, or so, the tables of
    a migrated store would not be a new store's."""
    for table in TABLES:
        versions = [column.since for column in table.columns]
        assert versions == sorted(versions), table.name
        assert all(BASE_VERSION <= version <= SCHEMA_VERSION for version in versions), table.name
        added = [column.sql for column in table.columns if column.since > BASE_VERSION]
        assert not [sql for sql in added if "NOT NULL" in sql or "PRIMARY KEY" in sql or "UNIQUE" in sql]
