"""An approval names the exact arguments it approves (issue 60): through the official openai client,
a call of a tool declared `approval=True` waits, and its approval lists `arguments_sha256`, the
digest of the arguments the call will run with. A decision naming another digest is a 409 and the
call still waits; the right one lets it run. A decision of other arguments that reaches the store
without that check (a stale listing on another replica) runs nothing. State in memory and in Redis."""

from __future__ import annotations

import json
from typing import Any

from gateway.demo.model import Reply
from gateway.tools.approvals import arguments_digest
from telemetry import names
from tests.conftest import (
    PAID,
    STREAM,
    USER,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    pending,
    tool_call_spans,
    while_asking,
)

ARGUMENTS = {"to": "ACME", "amount": 12.5}
DIGEST = arguments_digest("pay", ARGUMENTS)
OTHER = arguments_digest("pay", {"to": "ACME", "amount": 1250})


@STREAM
async def test_a_decision_naming_other_arguments_is_refused_and_the_right_one_runs(
        make_stack: StackFactory, state: dict[str, Any], stream: bool) -> None:
    stack = await make_stack(registry=approval_registry(), keepalive_seconds=0.05, **state)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", ARGUMENTS)]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert approval["arguments_sha256"] == DIGEST
        one = await stack.http.get(f"/v1/approvals/{approval['id']}")
        assert (await one.json())["arguments_sha256"] == DIGEST
        status, body = await decide(stack, approval["id"], decision="approve", arguments_sha256=OTHER)
        assert (status, body["error"]["type"], body["error"]["code"], body["error"]["param"]) == (
            409, "conflict_error", "arguments_changed", "arguments_sha256")
        for bad in ("ABC", DIGEST.upper(), 12):  # not a lower-case SHA-256 in hex
            status, body = await decide(stack, approval["id"], decision="approve", arguments_sha256=bad)
            assert (status, body["error"]["type"]) == (400, "invalid_request_error"), body
        assert [a["status"] for a in await pending(stack)] == ["pending"]
        assert PAID == []
        status, body = await decide(stack, approval["id"], decision="approve", arguments_sha256=DIGEST)
        assert (status, body["status"], body["arguments_sha256"]) == (200, "approved", DIGEST)

    answer = await while_asking(lambda: stack.ask(stream, messages=USER), reviewer)
    assert answer.content == "Paid."
    assert PAID == [ARGUMENTS]
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    assert ((call.attributes or {})[names.ATTR_OUTCOME], (call.attributes or {})[names.ATTR_TOOL_DECISION]) == (
        "ok", "approve")
    assert await pending(stack) == []


async def test_a_stale_approval_of_other_arguments_in_the_store_runs_nothing(make_stack: StackFactory,
                                                                              state: dict[str, Any]) -> None:
    """Written straight into the state store, as another replica deciding from a stale listing would:
    the waiting call compares the digest with its own, does not run, and the model is told why."""
    stack = await make_stack(registry=approval_registry(), **state)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", ARGUMENTS)]), Reply(content="It did not go through."))

    async def stale_replica() -> None:
        approval = await first_pending(stack)
        stale = {"decision": "approve", "by": None, "reason": None, "output": None, "has_output": False,
                 "arguments_sha256": OTHER}
        assert await stack.observability.state.approvals.decide(approval["id"], json.dumps(stale))

    answer = await while_asking(lambda: stack.ask(False, messages=USER), stale_replica)
    assert answer.content == "It did not go through."
    assert PAID == []
    [told] = [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]
    assert "approved for other arguments than this call's, so it did not run" in told
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    assert ((call.attributes or {})[names.ATTR_OUTCOME], (call.attributes or {})[names.ATTR_TOOL_DECISION]) == (
        "error", "arguments_changed")
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="arguments_changed") == 1
    assert await pending(stack) == []

