"""A call that waited for a reviewer, in the trajectory store and its views: the row keeps what
became of the approval, the key that decided and the wait; `toolspan trajectories show` and the
trajectory page print it next to the call ("approved by boss after 2.1 s", "denied by boss: over
the limit", "no decision within 300 s"). Each through a real request: a chat request waits, a
reviewer decides at /v1/approvals (or nobody does)."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.demo.model import Reply
from telemetry import names
from telemetry.store.columns import attribute_problem
from telemetry.store.otlp import export, import_file
from telemetry.store.schema import SCHEMA
from tests.conftest import (
    AGENT,
    AGENT_AND_BOSS,
    BOSS,
    USER,
    Answer,
    Stack,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    toolspan_cli,
    while_asking,
)

AS_AGENT, AS_BOSS = {"Authorization": f"Bearer {AGENT}"}, {"Authorization": f"Bearer {BOSS}"}
SECONDS = r"\d+(\.\d+)?"


async def _keyed(make_stack: StackFactory, limit: float | None = None) -> Stack:
    stack = await make_stack(registry=approval_registry(limit), keys=AGENT_AND_BOSS)
    stack.client.api_key = AGENT
    return stack


async def _waited(stack: Stack, reviewer: Callable[[dict[str, Any]], Awaitable[None]] | None) -> Answer:
    """One request whose `pay` call waits; `reviewer` decides it (None: nobody does). Its answer,
    once the store has written it."""
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 900})]), Reply(content="Done."))

    async def review() -> None:
        if reviewer is not None:
            await reviewer(await first_pending(stack, AS_AGENT))

    answer: Answer = await while_asking(lambda: stack.ask(False, messages=USER), review)
    await stack.store.flushed()
    return answer


def _row(stack: Stack) -> tuple[Any, ...]:
    with sqlite3.connect(stack.store.path) as db:
        [row] = db.execute("SELECT outcome, decision, decided_by, approval_wait_ms FROM tool_calls").fetchall()
    return tuple(row)


async def _shown(stack: Stack, answer: Answer) -> tuple[str, str]:
    """The decision as `toolspan trajectories show` prints it on the call's line, and as the
    trajectory page shows it (the page asked for as the key that made the request)."""
    trajectory = answer.headers["x-trajectory-id"]
    printed = await toolspan_cli("trajectories", "show", "--db", str(stack.store.path), "--key", "agent", trajectory)
    [line] = [line for line in printed.splitlines() if line.startswith("  tool call pay:")]
    said = re.fullmatch(r"  tool call pay: \w+ \([\d.]+ ms\) \[(.*)\]", line)
    assert said is not None, line
    page = await stack.http.get(f"/ui/trajectories/{trajectory}", headers=AS_AGENT)
    assert page.status == 200
    [decided] = re.findall(r'<li id="call-[0-9a-f]+" class="call [^"]*"[^>]*>.*?<div class="decision" '
                           r'data-decision="\w+">(.*?)</div>', await page.text())
    return said.group(1), decided


async def test_an_approval_shows_who_approved_and_after_how_long(make_stack: StackFactory) -> None:
    stack = await _keyed(make_stack)

    async def boss(approval: dict[str, Any]) -> None:
        assert (await decide(stack, approval["id"], AS_BOSS, decision="approve"))[0] == 200

    answer = await _waited(stack, boss)
    outcome, decision, by, wait_ms = _row(stack)
    assert (outcome, decision, by) == ("ok", "approve", "boss")
    assert 0 < wait_ms < 20_000
    printed, page = await _shown(stack, answer)
    assert re.fullmatch(rf"approved by boss after {SECONDS} s", printed)
    assert page == printed


async def test_a_denial_shows_who_denied_and_why(make_stack: StackFactory) -> None:
    stack = await _keyed(make_stack)

    async def boss(approval: dict[str, Any]) -> None:
        assert (await decide(stack, approval["id"], AS_BOSS, decision="deny", reason="over the <b>limit</b>"))[0] == 200

    answer = await _waited(stack, boss)
    assert _row(stack)[:3] == ("denied", "deny", "boss")
    printed, page = await _shown(stack, answer)
    assert printed == "denied by boss: over the <b>limit</b>"
    assert page == "denied by boss: over the &lt;b&gt;limit&lt;/b&gt;"  # the reviewer's words, as text


async def test_an_approval_of_other_arguments_shows_that_the_call_did_not_run(make_stack: StackFactory) -> None:
    """A decision naming another digest than the call's, written straight into the state store (a
    stale listing on another replica): the call does not run, and the views say why."""
    stack = await _keyed(make_stack)

    async def stale(approval: dict[str, Any]) -> None:
        said = {"decision": "approve", "by": "boss", "arguments_sha256": "0" * 64}
        assert await stack.observability.state.approvals.decide(approval["id"], json.dumps(said))

    answer = await _waited(stack, stale)
    outcome, decision, by, _ = _row(stack)
    assert (outcome, decision, by) == ("error", "arguments_changed", "boss")
    printed, page = await _shown(stack, answer)
    assert printed == page == "not run: approved by boss for other arguments"


async def test_a_decision_survives_an_export_and_an_import(make_stack: StackFactory, tmp_path: Any) -> None:
    stack = await _keyed(make_stack)

    async def boss(approval: dict[str, Any]) -> None:
        assert (await decide(stack, approval["id"], AS_BOSS, decision="deny", reason="no"))[0] == 200

    await _waited(stack, boss)
    exported = io.StringIO()
    with sqlite3.connect(stack.store.path) as db:
        export(db, exported)
    copy = sqlite3.connect(tmp_path / "copy.sqlite3")
    copy.executescript(SCHEMA)
    import_file(copy, exported.getvalue().splitlines())
    assert copy.execute("SELECT outcome, decision, decided_by, approval_wait_ms FROM tool_calls").fetchall() == [
        _row(stack)]
    copy.close()


async def test_nobody_deciding_shows_the_time_it_waited(make_stack: StackFactory) -> None:
    stack = await _keyed(make_stack, limit=0.3)
    answer = await _waited(stack, None)
    outcome, decision, by, wait_ms = _row(stack)
    assert (outcome, decision, by) == ("timeout", "timeout", None)
    assert wait_ms >= 300
    printed, page = await _shown(stack, answer)
    assert re.fullmatch(r"no decision within 0\.\d s", printed)  # 0.3, and a busy machine's overshoot
    assert page == printed


async def test_without_keys_an_approval_names_no_one(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry())
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 1})]), Reply(content="Paid."))

    async def reviewer() -> None:
        assert (await decide(stack, (await first_pending(stack))["id"], decision="approve"))[0] == 200

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    await stack.store.flushed()
    assert _row(stack)[:3] == ("ok", "approve", None)
    printed = await toolspan_cli("trajectories", "show", "--db", str(stack.store.path),
                                 answer.headers["x-trajectory-id"])
    assert re.search(rf"tool call pay: ok \([\d.]+ ms\) \[approved after {SECONDS} s\]", printed), printed


async def test_a_call_that_asked_no_one_shows_no_decision(make_stack: StackFactory) -> None:
    stack = await make_stack()
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await stack.ask(False, messages=USER)
    await stack.store.flushed()
    with sqlite3.connect(stack.store.path) as db:
        assert db.execute("SELECT decision, decided_by, approval_wait_ms FROM tool_calls").fetchall() == [
            (None, None, None)]
    page = await stack.http.get(f"/ui/trajectories/{answer.headers['x-trajectory-id']}")
    assert 'class="decision"' not in await page.text()


@pytest.mark.parametrize(("attributes", "problem"), [
    ({names.ATTR_TOOL_DECISION: 1}, f"attribute {names.ATTR_TOOL_DECISION} is not a string"),
    ({names.ATTR_DECIDED_BY: ["boss"]}, f"attribute {names.ATTR_DECIDED_BY} is not a string"),
    ({names.ATTR_APPROVAL_WAIT_MS: "2100"}, f"attribute {names.ATTR_APPROVAL_WAIT_MS} is not a number from 0"),
    ({names.ATTR_APPROVAL_WAIT_MS: -1.0}, f"attribute {names.ATTR_APPROVAL_WAIT_MS} is not a number from 0"),
    ({names.ATTR_APPROVAL_WAIT_MS: float("nan")}, f"attribute {names.ATTR_APPROVAL_WAIT_MS} is not a number from 0"),
    ({names.ATTR_TOOL_DECISION: "deny", names.ATTR_DECIDED_BY: "boss", names.ATTR_APPROVAL_WAIT_MS: 2100}, None)])
def test_an_imported_spans_decision_is_checked_for_its_row(attributes: dict[str, Any], problem: str | None) -> None:
    """A span from an OTLP file holds whatever its writer put: a decision's attributes of the wrong
    type are refused before any row is written (`toolspan trajectories import`)."""
    assert attribute_problem(attributes) == problem
