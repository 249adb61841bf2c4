"""What argument repair and aliases leave to read (issue 61), in the two-model session run with
repair on (tests.improve.session.MENDED_SETTINGS): each call's row in the store as counted by
hand; the trajectory page and `toolspan trajectories show` next to each call, its repair's mode,
changes and arguments before and after, and the aliases it used, escaped for the page and for a
terminal; and an OTLP export of the store imported again gives the same rows."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.ui.timeline import Paging, timeline_page
from telemetry import names
from telemetry.store import otlp, report, report_text
from telemetry.store.rows import suggestions
from telemetry.store.schema import SCHEMA
from tests.improve import session as scripted
from tests.improve.conftest import Session
from tests.ui.conftest import call_texts

_MENDED = ("SELECT trajectory_id, span_id, tool, repair_mode FROM tool_calls "
           "WHERE repair_mode IS NOT NULL OR aliases IS NOT NULL ORDER BY started")


def _rows(db: sqlite3.Connection) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT * FROM tool_calls ORDER BY started, span_id")
    columns = [column[0] for column in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor]


def _mended(session: Session, tool: str, mode: str | None) -> tuple[str, str]:
    """(trajectory id, span id) of the first call of `tool` repair found a fix for in `mode` (None:
    the first that used an alias)."""
    return next((trajectory, span) for trajectory, span, name, found in session.db.execute(_MENDED)
                if name == tool and found == mode)


def test_each_call_is_recorded_as_counted_by_hand(mended_session: Session) -> None:
    found = [(row["tool"], row["outcome"], row["repair_mode"],
              None if row["repair_changes"] is None else json.loads(row["repair_changes"]),
              suggestions(json.loads(row["aliases"] or "[]"))) for row in _rows(mended_session.db)]
    assert found == scripted.MENDED_CALLS
    repaired = [(row["tool"], json.loads(row["repair_before"]), json.loads(row["repair_after"]))
                for row in _rows(mended_session.db) if row["repair_mode"] is not None]
    assert repaired == [("read_file", {"file_path": "/a"}, {"path": "/a"}),
                        ("add", {"a": "1", "b": 2}, {"a": 1, "b": 2}),
                        ("search", {"query": "x", "tags": "red"}, {"query": "x", "tags": ["red"]})]


# --- the page ----------------------------------------------------------------------------------------------

async def _page(session: Session, trajectory_id: str, key: str) -> str:
    response = await session.gateway.http.get(f"/ui/trajectories/{trajectory_id}",
                                              headers={"Authorization": f"Bearer {key}"})
    assert response.status == 200
    return await response.text()


async def test_the_page_shows_a_repair_applied_with_the_arguments_before_and_after(
        mended_session: Session) -> None:
    trajectory, span = _mended(mended_session, "read_file", "apply")
    page = await _page(mended_session, trajectory, scripted.ALPHA_KEY)
    anchor = f"call-{span}"
    assert call_texts(page, "repair")[anchor] == ["repair applied: rename file_path -> path"]
    assert call_texts(page, "repair-before")[anchor] == [json.dumps({"file_path": "/a"}, indent=2)]
    assert call_texts(page, "repair-after")[anchor] == [json.dumps({"path": "/a"}, indent=2)]
    assert f'<li id="{anchor}" class="call repaired"' in page
    assert '<span class="tag repaired">repaired</span>' in page
    assert anchor not in call_texts(page, "aliases")


async def test_the_page_shows_a_repair_observed_and_the_aliases_a_call_used(mended_session: Session) -> None:
    trajectory, span = _mended(mended_session, "search", "observe")
    page = await _page(mended_session, trajectory, scripted.BETA_KEY)
    assert call_texts(page, "repair")[f"call-{span}"] == ["repair observed, not applied: wrap tags in an array"]
    assert 'data-mode="observe"' in page
    assert call_texts(page, "repair-after")[f"call-{span}"] == [json.dumps({"query": "x", "tags": ["red"]}, indent=2)]
    assert call_texts(page, "diagnostic")[f"call-{span}"]  # it stayed rejected: what the model was told
    trajectory, span = _mended(mended_session, "read_file", None)
    page = await _page(mended_session, trajectory, scripted.BETA_KEY)
    aliased = call_texts(page, "aliases")
    assert aliased[f"call-{span}"] == ["aliases used: filepath → path"]
    assert len(aliased) == 2  # both calls of the trajectory used it
    assert call_texts(page, "repair") == {}


HOSTILE = "<script>alert(1)</script>"
TERMINAL = "\x1b]0;owned\x07\x1b[2J"  # retitles the terminal, clears the screen


def _hostile(session: Session) -> tuple[str, dict[str, Any]]:
    """The repaired read_file call's trajectory, its repair and aliases replaced by hostile text."""
    trajectory_id, span = _mended(session, "read_file", "apply")
    found = report.trajectory(session.db, trajectory_id)
    assert found is not None
    for event in (e for request in found["requests"] for e in request["events"] if e.get("span_id") == span):
        event.update(aliases={f"{HOSTILE}{TERMINAL}": "path"}, repair_changes=[f"rename {HOSTILE}{TERMINAL} -> path"],
                     repair_before=json.dumps({HOSTILE + TERMINAL: "/a"}), repair_mode=f"<i>{TERMINAL}</i>")
    return trajectory_id, found


def test_what_the_model_chose_is_escaped_on_the_page(mended_session: Session) -> None:
    trajectory_id, found = _hostile(mended_session)
    page = str(timeline_page(found, Paging(trajectory_id, 1), None))
    assert HOSTILE not in page
    assert "<i>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    [said] = [text for texts in call_texts(page, "repair").values() for text in texts]
    assert said.startswith(f"repair (<i>{TERMINAL}</i>): rename {HOSTILE}")  # as text, once unescaped
    [aliased] = [text for texts in call_texts(page, "aliases").values() for text in texts]
    assert aliased == f"aliases used: {HOSTILE}{TERMINAL} → path"


def test_what_the_model_chose_is_made_visible_on_a_terminal(mended_session: Session) -> None:
    _, found = _hostile(mended_session)
    printed = "\n".join(report_text.timeline(found))
    assert "\x1b" not in printed
    assert "\x07" not in printed
    assert "      aliases used: <script>alert(1)</script>\\u001b]0;owned\\u0007\\u001b[2J -> path" in printed
    assert "      repair (<i>\\u001b]0;owned\\u0007\\u001b[2J</i>): rename <script>" in printed


# --- the terminal --------------------------------------------------------------------------------------------

def _shown(session: Session, trajectory_id: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What `toolspan trajectories show` prints of the trajectory."""
    assert main(["trajectories", "show", trajectory_id, "--db", str(session.path)]) == 0
    return capsys.readouterr().out.splitlines()


def test_show_prints_each_repair_with_the_arguments_before_and_after(
        mended_session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _shown(mended_session, _mended(mended_session, "add", "apply")[0], capsys)
    at = next(i for i, line in enumerate(lines) if line.startswith("  tool call add: repaired"))
    assert lines[at + 1:at + 4] == ["      repair applied: type a: string -> integer",
                                    '      before repair: {"a": "1", "b": 2}',
                                    '      after repair:  {"a": 1, "b": 2}']
    lines = _shown(mended_session, _mended(mended_session, "search", "observe")[0], capsys)
    at = next(i for i, line in enumerate(lines) if line.startswith("  tool call search: rejected (schema_violation)"))
    assert lines[at + 1:at + 4] == ["      repair observed, not applied: wrap tags in an array",
                                    '      before repair: {"query": "x", "tags": "red"}',
                                    '      after repair:  {"query": "x", "tags": ["red"]}']
    assert lines[at + 4].startswith("      | ")  # then what the model was told


def test_show_prints_the_aliases_a_call_used(mended_session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _shown(mended_session, _mended(mended_session, "read_file", None)[0], capsys)
    calls = [i for i, line in enumerate(lines) if line.startswith("  tool call read_file: ok")]
    assert [lines[i + 1] for i in calls] == ["      aliases used: filepath -> path"] * 2
    assert not [line for line in lines if "repair" in line]


# --- the store's export ---------------------------------------------------------------------------------------

def test_an_export_imported_again_keeps_the_repairs_and_aliases(mended_session: Session, tmp_path: Path) -> None:
    out = io.StringIO()
    otlp.export(mended_session.db, out)
    exported = out.getvalue()
    for attribute in (names.ATTR_REPAIR_MODE, names.ATTR_REPAIR_CHANGES, names.ATTR_REPAIR_BEFORE,
                      names.ATTR_REPAIR_AFTER, names.ATTR_ARGS_ALIASES):
        assert f'"key":"{attribute}"' in exported.replace(" ", ""), attribute
    copy = sqlite3.connect(tmp_path / "copy.sqlite3", isolation_level=None)
    copy.executescript(SCHEMA)
    otlp.import_file(copy, exported.splitlines())
    original, imported = _rows(mended_session.db), _rows(copy)
    assert [row["repair_mode"] for row in imported].count("apply") == 2
    differing = [(column, row[column], again[column]) for row, again in zip(original, imported, strict=True)
                 for column in row if row[column] != again[column] and not isinstance(row[column], float)]
    assert differing == []
