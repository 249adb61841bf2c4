"""gateway.tools.approval_gate.Approvals on its own, with stores that take their time (as Redis does): a client
that leaves while its approval is being asked or forgotten leaves nothing pending and stays gone,
and an approval that cannot be asked is said so to the model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.errors import Conflict
from gateway.state.approvals import ApprovalBounds, MemoryApprovals
from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from gateway.tools.approval_gate import Approvals, Viewer
from gateway.tools.approvals import ApprovalAsk, ApprovalDecision, arguments_digest, decided_outcome
from gateway.tools.hooks import NoHooks
from gateway.wire.headers import secret_names

EVERYONE = Viewer(None, sees_all=True, may_decide=True)
ASK = ApprovalAsk(ToolCall("call_1", "pay", "{}"), "before_run", {"amount": 1})


class SlowStore(MemoryApprovals):
    """A store whose `add` and `remove` each wait for the test to let them go."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.adding, self.removing = asyncio.Event(), asyncio.Event()
        self.go = asyncio.Event()

    async def add(self, approval_id: str, record: str, ttl_seconds: float, principal: str | None) -> bool:
        added = await super().add(approval_id, record, ttl_seconds, principal)
        self.adding.set()
        await self.go.wait()
        return added

    async def remove(self, approval_id: str, principal: str | None) -> None:
        self.removing.set()
        await self.go.wait()
        await super().remove(approval_id, principal)


async def decided(approvals: Approvals) -> ApprovalDecision:
    async with NoHooks().tool_call(ASK.call, None, Turn()) as trace:
        return await approvals.decided(ASK, Turn(), trace)


async def test_a_client_leaving_while_its_approval_is_asked_leaves_nothing_pending() -> None:
    store = SlowStore()
    approvals = Approvals(store, 30.0, secret_names(()))
    waiting = asyncio.ensure_future(decided(approvals))
    await store.adding.wait()  # the record is written; the ask has not returned yet
    waiting.cancel()
    store.go.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await store.held() == []
    assert await approvals.pending(EVERYONE) == []


async def test_a_client_leaving_while_a_decided_approval_is_forgotten_stays_gone() -> None:
    """Approved, then the client hangs up while the approval is being removed: the call must not run."""
    store = SlowStore()
    store.go.set()  # the ask goes through at once
    approvals = Approvals(store, 30.0, secret_names(()))
    waiting = asyncio.ensure_future(decided(approvals))
    while not (listed := await approvals.pending(EVERYONE)):
        await approvals.next_change().wait()
    store.go.clear()
    await approvals.decide(listed[0]["id"], EVERYONE, "approve")
    await store.removing.wait()
    waiting.cancel()
    store.go.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await store.held() == []


async def test_an_approval_that_cannot_be_asked_is_said_so_and_the_call_does_not_run() -> None:
    approvals = Approvals(MemoryApprovals(ApprovalBounds(capacity=0)), 30.0, secret_names(()))
    decision = await decided(approvals)
    assert decision.decision == "unavailable"
    outcome = decided_outcome(ToolOutcome("call_1", "pay", "interrupted", ""), decision, 30.0)
    assert (outcome.status, outcome.error_type) == ("error", "approval_unavailable")
    assert "could not ask for it now" in str(outcome.content)
    assert "request ended" not in str(outcome.content)


# --- the digest of the arguments an approval approves ---------------------------------------------

PAY = ApprovalAsk(ToolCall("call_2", "pay", "{}"), "before_run", {"amount": 5, "api_key": "sk-1"},
                  digest=arguments_digest("pay", {"amount": 5, "api_key": "sk-1"}))
OTHER = arguments_digest("pay", {"amount": 500, "api_key": "sk-1"})


async def waiting_on(approvals: Approvals, ask: ApprovalAsk) -> tuple[asyncio.Future[ApprovalDecision], str]:
    """`ask` waiting for its decision, and its approval's id once it is listed."""
    async def wait() -> ApprovalDecision:
        async with NoHooks().tool_call(ask.call, None, Turn()) as trace:
            return await approvals.decided(ask, Turn(), trace)

    waiting = asyncio.ensure_future(wait())
    while True:
        changed = approvals.next_change()
        if listed := await approvals.pending(EVERYONE):
            return waiting, listed[0]["id"]
        await changed.wait()


async def test_an_approval_lists_the_digest_of_the_unmasked_arguments_it_asks_about() -> None:
    approvals = Approvals(MemoryApprovals(), 30.0, secret_names(("api_key",)))
    waiting, approval_id = await waiting_on(approvals, PAY)
    [listed] = await approvals.pending(EVERYONE)
    assert listed["arguments"] == {"amount": 5, "api_key": "[REDACTED]"}  # shown masked, digested as they run
    assert listed["arguments_sha256"] == PAY.digest == arguments_digest("pay", {"api_key": "sk-1", "amount": 5})
    assert (await approvals.one(approval_id, EVERYONE))["arguments_sha256"] == PAY.digest
    await approvals.decide(approval_id, EVERYONE, "deny")
    assert (await waiting).decision == "deny"


async def test_a_decision_naming_other_arguments_is_a_409_and_the_approval_stays_pending() -> None:
    approvals = Approvals(MemoryApprovals(), 30.0, secret_names(()))
    waiting, approval_id = await waiting_on(approvals, PAY)
    with pytest.raises(Conflict) as refused:
        await approvals.decide(approval_id, EVERYONE, "approve", arguments_sha256=OTHER)
    assert (refused.value.code, refused.value.param) == ("arguments_changed", "arguments_sha256")
    assert [a["status"] for a in await approvals.pending(EVERYONE)] == ["pending"]
    assert not waiting.done()
    decided = await approvals.decide(approval_id, EVERYONE, "approve", arguments_sha256=PAY.digest)
    assert (decided["status"], decided["arguments_sha256"]) == ("approved", PAY.digest)
    assert (await waiting).decision == "approve"


async def test_a_stale_decision_of_other_arguments_in_the_store_runs_nothing() -> None:
    """A decision that reached the store without the route's check (another replica, another
    version): the waiting call compares it with what it asked, and does not run."""
    store = MemoryApprovals()
    approvals = Approvals(store, 30.0, secret_names(()))
    waiting, approval_id = await waiting_on(approvals, PAY)
    assert await store.decide(approval_id, json.dumps({"decision": "approve", "by": "boss", "arguments_sha256": OTHER}))
    decision = await waiting
    assert (decision.decision, decision.by) == ("arguments_changed", "boss")
    outcome = decided_outcome(ToolOutcome("call_2", "pay", "interrupted", ""), decision, 30.0)
    assert (outcome.status, outcome.error_type) == ("error", "approval_arguments_changed")
    assert "approved for other arguments" in str(outcome.content)
    assert await store.held() == []
    # A decision written without a digest approves what was asked; denying other arguments still denies.
    for said, expected in (({"decision": "approve"}, "approve"),
                           ({"decision": "deny", "arguments_sha256": OTHER}, "deny")):
        waiting, approval_id = await waiting_on(approvals, PAY)
        assert await store.decide(approval_id, json.dumps(said))
        assert (await waiting).decision == expected


async def test_the_executor_asks_about_the_parsed_arguments_and_runs_only_what_was_approved() -> None:
    ran: list[dict[str, Any]] = []
    pay = Tool(name="pay", function=lambda args: ran.append(args) or "paid", approval=True,
               parameters=[Param("to", "string", required=True), Param("amount", "number", required=True)])
    store = MemoryApprovals()
    approvals = Approvals(store, 30.0, secret_names(()))
    executor = ToolExecutor(ToolRegistry([pay]), gate=approvals)
    sent = ToolCall("call_3", "pay", '{"amount": 7, "to": "ACME"}')

    async def listed() -> dict[str, Any]:
        while True:
            changed = approvals.next_change()
            if found := await approvals.pending(EVERYONE):
                return found[0]
            await changed.wait()

    running = asyncio.ensure_future(executor.run_call(sent, Turn()))
    approval = await listed()
    assert approval["arguments_sha256"] == arguments_digest("pay", {"to": "ACME", "amount": 7})
    await store.decide(approval["id"], json.dumps({"decision": "approve", "arguments_sha256": OTHER}))
    outcome = await running
    assert (outcome.status, outcome.error_type, ran) == ("error", "approval_arguments_changed", [])

    running = asyncio.ensure_future(executor.run_call(sent, Turn()))
    approval = await listed()
    await approvals.decide(approval["id"], EVERYONE, "approve", arguments_sha256=approval["arguments_sha256"])
    assert ((await running).status, ran) == ("ok", [{"to": "ACME", "amount": 7}])
