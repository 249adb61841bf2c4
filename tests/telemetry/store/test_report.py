"""The report's figures, checked against the spans exported in the same run; the list, one
trajectory's timeline, and the OTLP JSON round trip."""

from __future__ import annotations

import io
import sqlite3
from collections import Counter
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from telemetry import names
from telemetry.store import otlp, report
from telemetry.store.report_text import timeline
from telemetry.store.schema import SCHEMA
from tests.telemetry.conftest import STORED_ACROSS, Session, attr, hex_id, stored_trajectory


def _by_tool(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    grouped: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        grouped.setdefault(str(attr(span, names.ATTR_TOOL_NAME)), []).append(span)
    return grouped


def _failed(span: ReadableSpan) -> bool:
    return attr(span, names.ATTR_OUTCOME) in report.FAILED


def test_per_tool_figures_match_the_spans(session: Session) -> None:
    figures = {item["tool"]: item for item in report.report(session.db)["tools"]}
    spans = _by_tool(session.tool_spans())
    assert set(figures) == set(spans)
    for tool, calls in spans.items():
        item = figures[tool]
        reasons = Counter(attr(s, names.ATTR_REJECTION_REASON) for s in calls if attr(s, names.ATTR_REJECTION_REASON))
        kinds = Counter(attr(s, names.ATTR_RETRY_KIND) for s in calls if attr(s, names.ATTR_RETRY_KIND))
        failed = sum(_failed(s) for s in calls)
        assert item["calls"] == len(calls)
        assert item["outcomes"] == dict(Counter(attr(s, names.ATTR_OUTCOME) for s in calls))
        assert item["rejections_by_reason"] == {r: {"count": n, "rate": n / len(calls)} for r, n in reasons.items()}
        assert item["rejection_rate"] == sum(reasons.values()) / len(calls)
        assert (item["retries"]["verbatim"], item["retries"]["corrected"]) == (kinds["verbatim"], kinds["corrected"])
        assert item["retries"]["verbatim_rate"] == (kinds["verbatim"] / failed if failed else None)


def test_renames_retries_and_recoveries(session: Session) -> None:
    figures = {item["tool"]: item for item in report.report(session.db)["tools"]}
    read_file, add, locked = figures["read_file"], figures["add"], figures["locked"]
    assert read_file["renames"] == [{"from": "file_path", "to": "path", "count": 1}]
    assert (read_file["failures"], read_file["recoveries"], read_file["recovery_rate"]) == (1, 1, 1.0)
    assert read_file["rounds_to_recover"] == {"mean": 1, "max": 1}  # rejected in round 0, ok in round 1
    # The retry of the trajectory spanning requests: rejected in its first request's first turn,
    # corrected in the second request's first turn: two model turns later.
    assert (add["recoveries"], add["failures"], add["rounds_to_recover"]) == (1, 2, {"mean": 2, "max": 2})
    assert (locked["failures"], locked["recoveries"], locked["retries"]["verbatim"]) == (1, 0, 2)
    assert locked["retries"]["verbatim_rate"] == pytest.approx(2 / 3)


def test_stuck_trajectories_are_flagged(session: Session) -> None:
    figures = report.report(session.db)
    [stuck] = figures["stuck"]
    first_span = session.tool_spans()[0]
    first = stored_trajectory(first_span)
    assert stuck == {"trajectory_id": first, "key": "agent", "local_id": attr(first_span, names.ATTR_CONVERSATION_ID),
                     "tool": "locked", "model": "test-model", "verbatim_retries": 2}
    assert {item["tool"]: item["stuck_trajectories"] for item in figures["tools"]}["locked"] == [first]
    listed = {item["id"]: item["stuck"] for item in report.list_trajectories(session.db)}
    assert listed == {first: True, STORED_ACROSS: False}


def test_per_model_figures_and_totals(session: Session) -> None:
    figures = report.report(session.db)
    spans = session.tool_spans()
    [model] = figures["models"]
    assert model["model"] == "test-model"
    assert model["calls"] == len(spans) == figures["tool_calls"]
    chats = [s for s in session.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    assert figures["model_turns"] == len(chats)
    assert figures["input_tokens"] == sum(int(attr(s, names.ATTR_INPUT_TOKENS)) for s in chats)
    assert figures["overall"]["rejections"] == sum(attr(s, names.ATTR_OUTCOME) == "rejected" for s in spans)


def test_the_list_is_newest_first_and_filters(session: Session) -> None:
    assert next(t["id"] for t in report.list_trajectories(session.db)) == STORED_ACROSS
    assert [t["id"] for t in report.list_trajectories(session.db, tool="add", outcome="ok")] == [STORED_ACROSS]
    assert [t["id"] for t in report.list_trajectories(session.db, outcome="timeout")] != [STORED_ACROSS]
    assert report.list_trajectories(session.db, model="another-model") == []
    assert report.list_trajectories(session.db, since=10**10) == []
    assert len(report.list_trajectories(session.db, limit=1)) == 1
    [across] = report.list_trajectories(session.db, tool="add", outcome="ok")
    assert (across["requests"], across["tool_calls"], across["retries"]) == (2, 2, 1)
    assert across["trace_ids"] == session.trace_ids[1:]


def test_one_trajectorys_timeline(session: Session) -> None:
    found = report.trajectory(session.db, STORED_ACROSS)
    assert found is not None
    assert [r["trace_id"] for r in found["requests"]] == session.trace_ids[1:]
    events = [e for r in found["requests"] for e in r["events"]]
    assert [e["type"] for e in events] == ["model_turn", "tool_call", "model_turn", "model_turn", "tool_call",
                                           "model_turn"]
    rejected, retry = (e for e in events if e["type"] == "tool_call")
    assert rejected["diagnostic"].startswith("Tool 'add': required arguments are missing.")
    assert (retry["retry_kind"], retry["retries_span_id"]) == ("corrected", rejected["span_id"])
    lines = timeline(found)
    assert f"[corrected retry of span {rejected['span_id']}]" in "\n".join(lines)
    assert report.trajectory(session.db, "no-such-trajectory") is None


def test_rejections_over_time(session: Session) -> None:
    buckets = report.rejections_over_time(session.db, bucket_seconds=10**9)
    assert sum(b["calls"] for b in buckets) == len(session.tool_spans())
    assert sum(b["rejections"] for b in buckets) == sum(
        attr(s, names.ATTR_OUTCOME) == "rejected" for s in session.tool_spans())


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf by its path, for pytest.approx (times go through nanoseconds and back)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{path}[{i}]").items()} | {
            f"{path}#": len(value)}
    return {path: value}


def _everything(db: sqlite3.Connection) -> dict[str, Any]:
    return _flat({"report": report.report(db), "list": report.list_trajectories(db),
                  "timelines": [report.trajectory(db, t["id"]) for t in report.list_trajectories(db)]})


def test_export_then_import_gives_the_same_answers(session: Session) -> None:
    out = io.StringIO()
    exported = otlp.export(session.db, out)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(session.trace_ids)
    assert exported == sum(
        1 for s in session.spans() if s.name == names.SPAN_TOOL_CALL or s.name.startswith("chat ")
        or s.kind.name == "SERVER")
    copy = sqlite3.connect(":memory:", isolation_level=None)
    copy.executescript(SCHEMA)
    assert otlp.import_file(copy, lines) == exported
    imported, original = _everything(copy), _everything(session.db)
    assert imported.keys() == original.keys()
    differing = {k: (imported[k], v) for k, v in original.items() if imported[k] != v and not (
        isinstance(v, float) and abs(imported[k] - v) < 1e-3)}  # times: a microsecond at most
    assert differing == {}


def test_importing_the_same_file_twice_changes_nothing(session: Session) -> None:
    out = io.StringIO()
    otlp.export(session.db, out)
    copy = sqlite3.connect(":memory:", isolation_level=None)
    copy.executescript(SCHEMA)
    otlp.import_file(copy, out.getvalue().splitlines())
    once = sorted(copy.execute("SELECT span_id, round FROM model_turns"))
    assert once == sorted(session.db.execute("SELECT span_id, round FROM model_turns"))
    otlp.import_file(copy, out.getvalue().splitlines())
    assert sorted(copy.execute("SELECT span_id, round FROM model_turns")) == once
    assert report.report(copy) == report.report(session.db)


def test_import_reads_the_collectors_spelling(session: Session) -> None:
    """A collector writes enum names for kinds and status codes, and upper-case ids, in places."""
    out = io.StringIO()
    otlp.export(session.db, out)
    text = out.getvalue().replace('"kind":2', '"kind":"SPAN_KIND_SERVER"')
    text = text.replace('"kind":3', '"kind":"SPAN_KIND_CLIENT"')
    text = text.replace('"code":2', '"code":"STATUS_CODE_ERROR"')
    copy = sqlite3.connect(":memory:", isolation_level=None)
    copy.executescript(SCHEMA)
    otlp.import_file(copy, text.splitlines())
    assert report.report(copy) == report.report(session.db)
    with pytest.raises(ValueError, match="line 2: not an OTLP JSON trace export"):
        otlp.import_file(copy, ["", "{not json"])


def test_spans_in_the_store_keep_their_ids(session: Session) -> None:
    stored = {s.span_id for s in otlp.stored_spans(session.db)}
    assert {hex_id(s.context.span_id) for s in session.tool_spans()} <= stored
