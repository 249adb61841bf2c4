"""gateway.tools.approval_gate.Approvals on its own, with stores that take their time (as Redis does): a client
that leaves while its approval is being asked or forgotten leaves nothing pending and stays gone,
and an approval that cannot be asked is said so to the model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.state.approvals import ApprovalBounds, MemoryApprovals
from gateway.tools import ToolCall, ToolOutcome, Turn
from gateway.tools.approval_gate import Approvals, Viewer
from gateway.tools.approvals import ApprovalAsk, ApprovalDecision, decided_outcome
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
