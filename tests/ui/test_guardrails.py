"""The page shows what guardrails decided (issue 59): next to each call on its trajectory's page, in
words and escaped; on the report page, the decisions counted and the calls they stopped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from html.parser import HTMLParser
from typing import Any

import pytest

from gateway.ui.timeline import Paging, timeline_page
from telemetry import names
from telemetry.store import report
from tests.conftest import AUTH, StackFactory
from tests.telemetry.conftest import LEAKED, STORED_ACROSS, Session, attr, hex_id, scripted_session
from tests.ui.conftest import table_rows


@pytest.fixture
async def session(make_stack: StackFactory) -> AsyncIterator[Session]:
    async with scripted_session(make_stack) as found:
        yield found


class _Texts(HTMLParser):
    """The text of each element with a given class, by the id of the call (`li`) it is in."""

    def __init__(self, cls: str) -> None:
        super().__init__()
        self.cls = cls
        self.found: dict[str, list[str]] = {}
        self._call: str | None = None
        self._depth = 0  # inside an element of `cls`: how deep
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "li" and (attributes.get("id") or "").startswith("call-"):
            self._call = attributes["id"]
        if self._depth:
            self._depth += 1
        elif self.cls in (attributes.get("class") or "").split():
            self._depth, self._text = 1, []

    def handle_endtag(self, tag: str) -> None:
        if self._depth:
            self._depth -= 1
            if not self._depth and self._call is not None:
                self.found.setdefault(self._call, []).append("".join(self._text))

    def handle_data(self, data: str) -> None:
        if self._depth:
            self._text.append(data)


def _guardrail_lines(page: str) -> dict[str, list[str]]:
    parser = _Texts("guardrail")
    parser.feed(page)
    return parser.found


def _call_anchor(session: Session, tool: str) -> str:
    [span] = [s for s in session.tool_spans() if attr(s, names.ATTR_TOOL_NAME) == tool]
    return f"call-{hex_id(span.context.span_id)}"


async def test_each_calls_guardrail_decisions_show_next_to_it(session: Session) -> None:
    [first] = [t for t in report.list_trajectories(session.db) if t["id"] != STORED_ACROSS]
    response = await session.stack.http.get(f"/ui/trajectories/{first['id']}", headers=AUTH)
    assert response.status == 200
    page = await response.text()
    lines = _guardrail_lines(page)
    assert lines == {
        _call_anchor(session, "deploy"): [
            "guardrail no_production denied the call: production is off limits; deploy to staging"],
        _call_anchor(session, "fetch_page"): [
            "guardrail masks_tokens masked the result: credentials masked (a GitHub token)"]}
    assert LEAKED not in page


async def test_the_report_page_counts_the_decisions_and_lists_the_stopped_calls(session: Session) -> None:
    response = await session.stack.http.get("/ui", headers=AUTH)
    page = await response.text()
    assert '<h2>Guardrails</h2>' in page
    assert table_rows(page, "guardrails") == [["masks_tokens", "mask", "1", "0"], ["no_production", "deny", "1", "0"]]
    assert "<h3>Calls a guardrail stopped (1)</h3>" in page
    [(trajectory, _, tool, words)] = table_rows(page, "guardrail-stopped")
    [first] = [t for t in report.list_trajectories(session.db) if t["id"] != STORED_ACROSS]
    assert (trajectory, tool) == (first["local_id"], "deploy")
    assert words == "guardrail no_production denied the call: production is off limits; deploy to staging"


def _with_decisions(session: Session, decisions: list[dict[str, Any]]) -> str:
    """The first trajectory's page, its `deploy` call's decisions replaced by `decisions`."""
    [first] = [t for t in report.list_trajectories(session.db) if t["id"] != STORED_ACROSS]
    found = report.trajectory(session.db, first["id"])
    assert found is not None
    for event in (e for r in found["requests"] for e in r["events"]):
        if event.get("tool") == "deploy":
            event["guardrails"] = decisions
    return str(timeline_page(found, Paging(first["id"], 1), None))


def test_what_a_guardrail_says_is_escaped(session: Session) -> None:
    page = _with_decisions(session, [{"guardrail": "<b>evil</b>", "moment": "before", "decision": "deny",
                                      "reason": "<script>alert(1)</script>", "failed": None}])
    assert "<script>alert(1)</script>" not in page
    assert "<b>evil</b>" not in page
    assert _guardrail_lines(page)[_call_anchor(session, "deploy")] == [
        "guardrail <b>evil</b> denied the call: <script>alert(1)</script>"]  # as text, once unescaped


def test_the_guardrails_that_only_allowed_a_call_are_named_in_one_line(session: Session) -> None:
    page = _with_decisions(session, [
        {"guardrail": "first", "moment": "before", "decision": "allow"},
        {"guardrail": "second", "moment": "before", "decision": "flag", "reason": "a production host"},
        {"guardrail": "first", "moment": "after", "decision": "allow"},
        {"guardrail": "third", "moment": "after", "decision": "allow"}])
    assert _guardrail_lines(page)[_call_anchor(session, "deploy")] == [
        "guardrail second flagged the call: a production host", "guardrails first, third allowed it"]
