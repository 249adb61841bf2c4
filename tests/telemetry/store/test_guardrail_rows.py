"""The store keeps what guardrails decided on each tool call (issue 59): the decision that stands,
as the call's span says it, and every decision, as its span's events say them; a client call's
row gains the decisions on its result when a later request brings it; nothing a guardrail hid is
stored. The report counts the decisions and lists the calls they stopped; the terminal timeline
says what each guardrail did."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.guardrails import GuardrailRecord
from gateway.tools import ToolCall, ToolOutcome, Turn
from gateway.tools.hooks import ClientResult
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.store import report, report_text
from telemetry.store.records import write
from telemetry.store.rows import guardrail_words
from telemetry.store.schema import SCHEMA, connect
from telemetry.store.span_records import record_of
from telemetry.tracing import build_provider, tracer_of
from tests.telemetry.conftest import LEAKED, STORED_ACROSS, Session, attr, hex_id, stored_trajectory

_STANDING = ("guardrail", "guardrail_decision", "guardrail_reason", "guardrail_moment")


def _calls(db: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    cursor = db.execute("SELECT * FROM tool_calls")
    columns = [c[0] for c in cursor.description]
    return {row[0]: dict(zip(columns, row, strict=True)) for row in cursor}


def _from_events(span: ReadableSpan) -> list[dict[str, Any]] | None:
    keys = {"guardrail": names.ATTR_GUARDRAIL_NAME, "moment": names.ATTR_GUARDRAIL_MOMENT,
            "decision": names.ATTR_GUARDRAIL_DECISION, "reason": names.ATTR_GUARDRAIL_REASON,
            "failed": names.ATTR_GUARDRAIL_FAILED}
    found = [{field: (event.attributes or {}).get(key) for field, key in keys.items()}
             for event in span.events if event.name == names.EVENT_GUARDRAIL]
    return found or None


def test_each_calls_guardrail_decisions_are_stored_as_its_span_says(session: Session) -> None:
    rows = _calls(session.db)
    for span in session.tool_spans():
        row = rows[hex_id(span.context.span_id)]
        stored = json.loads(row["guardrails"]) if row["guardrails"] is not None else None
        assert stored == _from_events(span)
    by_tool = {row["tool"]: row for row in rows.values()}
    denied, masked = by_tool["deploy"], by_tool["fetch_page"]
    assert tuple(denied[c] for c in _STANDING) == ("no_production", "deny",
                                                   "production is off limits; deploy to staging", "before")
    assert (denied["outcome"], denied["rejection_reason"]) == ("rejected", "guardrail_denied")
    assert json.loads(denied["arguments"]) == {"host": "prod", "note": "with [REDACTED]"}
    assert tuple(masked[c] for c in _STANDING) == ("masks_tokens", "mask", "credentials masked (a GitHub token)",
                                                   "after")
    assert json.loads(masked["guardrails"]) == [{"guardrail": "masks_tokens", "moment": "after", "decision": "mask",
                                                 "reason": "credentials masked (a GitHub token)", "failed": None}]
    assert [row for row in rows.values() if row["guardrails"] is None and row["guardrail"] is not None] == []


def test_nothing_a_guardrail_hid_is_stored(session: Session) -> None:
    dump = "\n".join(session.db.iterdump())
    assert LEAKED not in dump
    assert "with [REDACTED]" in dump


TURN = Turn(trajectory_id="traj-c", request_id="req-c", round=1)


def _telemetry() -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])),
                          Metrics(CollectorRegistry()))
    return telemetry, exporter


async def test_a_client_calls_row_gains_the_decisions_on_its_result(tmp_path: Path) -> None:
    telemetry, exporter = _telemetry()
    call = ToolCall("call_c", "shell", json.dumps({"command": "cat notes"}))
    async with telemetry.tool_call(call, None, TURN, side="client") as trace:
        trace.guarded([GuardrailRecord("flags", "before", "flag", "reads files", side="client")], [])
        trace.finish(ToolOutcome(call.id, call.name, "ok", ""))
    telemetry.client_result(ClientResult("call_c", "shell", sent_at=None, size=40, error=False, guardrails=(
        GuardrailRecord("secrets", "after", "allow", side="client"),
        GuardrailRecord("masks", "after", "mask", f"masked {LEAKED}", side="client")), hidden=(LEAKED,)), TURN)
    checked, result = (record_of(span) for span in exporter.get_finished_spans())
    db = connect(str(tmp_path / "store.sqlite3"))
    write(db, [checked])
    [row] = _calls(db).values()
    assert tuple(row[c] for c in _STANDING) == ("flags", "flag", "reads files", "before")
    write(db, [result])
    [row] = _calls(db).values()
    assert tuple(row[c] for c in _STANDING) == ("masks", "mask", "masked [REDACTED]", "after")
    assert [(d["guardrail"], d["moment"], d["decision"]) for d in json.loads(row["guardrails"])] == [
        ("flags", "before", "flag"), ("secrets", "after", "allow"), ("masks", "after", "mask")]
    assert row["result_bytes"] == 40
    write(db, [result])  # the same result written again (an OTLP file imported twice) changes nothing
    assert _calls(db) == {row["span_id"]: row}
    assert LEAKED not in "\n".join(db.iterdump())


async def test_a_denied_client_call_stands_over_an_allowed_result(tmp_path: Path) -> None:
    telemetry, exporter = _telemetry()
    call = ToolCall("call_d", "shell", "{}")
    async with telemetry.tool_call(call, None, TURN, side="client") as trace:
        trace.guarded([GuardrailRecord("refuses", "before", "deny", "no shell", side="client")], [])
        trace.finish(ToolOutcome(call.id, call.name, "ok", ""))
    telemetry.client_result(ClientResult("call_d", "shell", sent_at=None, size=2, error=False, guardrails=(
        GuardrailRecord("secrets", "after", "allow", side="client"),)), TURN)
    db = connect(str(tmp_path / "store.sqlite3"))
    write(db, [record_of(span) for span in exporter.get_finished_spans()])  # one batch: the call, then its result
    [row] = _calls(db).values()
    assert tuple(row[c] for c in _STANDING) == ("refuses", "deny", "no shell", "before")
    assert len(json.loads(row["guardrails"])) == 2



def test_the_report_counts_the_decisions_and_lists_the_calls_they_stopped(session: Session) -> None:
    figures = report.report(session.db)
    guardrails = figures["guardrails"]
    assert guardrails["decisions"] == [{"guardrail": "masks_tokens", "decision": "mask", "count": 1},
                                       {"guardrail": "no_production", "decision": "deny", "count": 1}]
    assert (guardrails["failures"], guardrails["stopped_calls"]) == ({}, 1)
    [stopped] = guardrails["stopped"]
    [deploy] = [s for s in session.tool_spans() if attr(s, names.ATTR_TOOL_NAME) == "deploy"]
    assert stopped == {"id": stored_trajectory(deploy), "key": "agent",
                       "local_id": attr(deploy, names.ATTR_CONVERSATION_ID), "span_id": hex_id(deploy.context.span_id),
                       "tool": "deploy", "side": "gateway", "started": pytest.approx((deploy.start_time or 0) / 1e9),
                       "guardrail": "no_production", "decision": "deny", "moment": "before",
                       "reason": "production is off limits; deploy to staging"}
    lines = report_text.report(figures)
    at = lines.index("guardrail decisions:")
    assert lines[at:at + 3] == ["guardrail decisions:", "  masks_tokens: mask 1", "  no_production: deny 1"]
    assert lines[-2] == "calls a guardrail stopped: 1"
    assert lines[-1].endswith(f"{stopped['local_id']}  deploy: guardrail no_production denied the call: "
                              "production is off limits; deploy to staging")


def test_the_terminal_timeline_says_what_each_guardrail_did(session: Session) -> None:
    [first] = [t for t in report.list_trajectories(session.db) if t["id"] != STORED_ACROSS]
    lines = report_text.timeline(report.trajectory(session.db, first["id"]) or {})
    deploy = next(i for i, line in enumerate(lines) if line.startswith("  tool call deploy:"))
    assert lines[deploy:deploy + 2] == [
        lines[deploy], "      guardrail no_production denied the call: production is off limits; deploy to staging"]
    assert "(guardrail_denied)" in lines[deploy]
    fetch = next(i for i, line in enumerate(lines) if line.startswith("  tool call fetch_page:"))
    assert lines[fetch + 1] == "      guardrail masks_tokens masked the result: credentials masked (a GitHub token)"


def test_a_report_of_no_guardrail_decision_says_nothing_of_them() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    figures = report.report(db)
    assert figures["guardrails"] == {"decisions": [], "failures": {}, "stopped_calls": 0, "stopped": []}
    assert not [line for line in report_text.report(figures) if "guardrail" in line]


@pytest.mark.parametrize(("decision", "words"), [
    ({"guardrail": "g", "decision": "allow", "moment": "before"}, "guardrail g allowed the call"),
    ({"guardrail": "g", "decision": "flag", "moment": "after", "reason": "an instruction to the model"},
     "guardrail g flagged the result: an instruction to the model"),
    ({"guardrail": "g", "decision": "rewrite", "moment": "before"}, "guardrail g rewrote the arguments"),
    ({"guardrail": "g", "decision": "ask", "moment": "before"}, "guardrail g asked for a reviewer's approval"),
    ({"guardrail": "g", "decision": "block", "moment": "after", "reason": "the guardrail raised ValueError",
      "failed": "ValueError"},
     "guardrail g withheld the result (it failed: ValueError): the guardrail raised ValueError"),
])
def test_each_decision_reads_as_words(decision: dict[str, Any], words: str) -> None:
    assert guardrail_words(decision) == words
