"""Approval of a tool call by a reviewer, as the executor sees it: what it asks, what it is told,
and what the model then gets. Where the approvals wait and who decides is gateway.tools.approval_gate'.

A call is asked about before its body runs when its tool is declared `approval=True`, and after,
when its body raised `Interrupt(message, data)`. The reviewer approves (the body runs; for an
Interrupt, the reviewer's `output` is the call's result), denies (the model is told so, with the
reason), or nobody decides in time (the model is told that too). The request waits meanwhile; its
client sees one ordinary answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from pydantic_core import to_jsonable_python

from gateway.state.base import DIGEST_HEAD  # the fewest hex digits of a digest that name the arguments approved
from gateway.tools.approval_text import denial
from gateway.tools.hooks import ToolCall, ToolCallTrace, Turn
from gateway.tools.results import ToolOutcome

Kind = Literal["before_run", "interrupt"]  # asked before the body runs, or because the body paused
# What became of an approval: a reviewer's approve or deny; or no decision in time, the client gone
# while it waited, the gateway shutting down, or no approval could be asked (the state store full
# or unavailable); or an approval of other arguments than the call's (arguments_changed).
Decided = Literal["approve", "deny", "timeout", "cancelled", "shutdown", "unavailable", "arguments_changed"]


@dataclass(frozen=True)
class ApprovalAsk:
    """One call a reviewer is asked about."""

    call: ToolCall
    kind: Kind
    arguments: Mapping[str, Any]  # as parsed: what the body runs (or ran) with
    message: str | None = None  # an Interrupt's message (what the model would have been told)
    data: Any = None  # an Interrupt's data: for the reviewer, never for the model
    timeout: float | None = None  # the tool's own; None: the gateway's
    digest: str = ""  # arguments_digest of the tool's name and `arguments` (unmasked): what a decision approves


@dataclass(frozen=True)
class ApprovalDecision:
    """What became of one approval, and after how long."""

    decision: Decided
    waited_seconds: float
    approval_id: str = ""
    by: str | None = None  # the gateway key that decided; None without keys
    reason: str | None = None
    output: Any = None  # the reviewer's result of an Interrupt's call
    has_output: bool = False


@dataclass(frozen=True)
class ClientDecision:
    """The client's answer to a call it was asked to approve (a Responses `mcp_approval_response`):
    it approves, or denies, the call with the arguments its approval names, and only those."""

    call_id: str  # the model's id of the call
    approve: bool
    digest: str  # the arguments approved: their arguments_digest, or the head of it the approval's id carries
    reason: str | None = None
    copy_digest: str | None = None  # the digest of the client's resent copy of the request, when it sent one
    token: str = ""  # the held turn the approval names

    def approves(self, digest: str) -> bool:
        """It approves a call whose arguments have `digest`: nothing else runs on it."""
        named = len(self.digest) >= DIGEST_HEAD and digest.startswith(self.digest)
        return self.approve and named and self.copy_digest in (None, digest)


class ApprovalGate(Protocol):
    """Where the executor waits for decisions (gateway.tools.approval_gate.Approvals)."""

    async def decided(self, ask: ApprovalAsk, turn: Turn, trace: ToolCallTrace) -> ApprovalDecision:
        """Wait for the decision on `ask`; whatever ends the wait (a decision, the time limit, the
        client leaving, a shutdown), no approval of it is left pending."""


def arguments_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """The hex SHA-256 naming one call's exact arguments: what an approval approves. Keys are sorted
    and the separators fixed, so the same arguments always give the same digest whatever their
    order; parsed (pydantic) values are made plain JSON first, as the approval record shows them."""
    plain = to_jsonable_python({"tool": tool, "arguments": arguments}, fallback=repr)
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _output(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def decided_outcome(template: ToolOutcome, decision: ApprovalDecision, limit: float) -> ToolOutcome:
    """The call's outcome when its approval was not given (or, for an Interrupt, given with the
    reviewer's output): `template` is the outcome it had so far (the Interrupt's, or an empty one)."""
    name = template.tool_name
    if decision.decision == "approve":  # only an Interrupt comes here approved: its result is the reviewer's
        content = _output(decision.output) if decision.has_output else "approved by the reviewer"
        return replace(template, status="ok", content=content, processed_content=decision.output,
                       interrupt_data=None)
    if decision.decision == "deny":
        return replace(template, status="denied", content=denial(decision.reason),
                       error_type="denied", interrupt_data=None)
    if decision.decision == "timeout":
        message = (f"Tool '{name}' needed a reviewer's approval, and nobody decided within {limit:g} s: the call "
                   "was not approved. Do not call it again unless the user asks.")
        return replace(template, status="timeout", content=message, error_type="approval_timeout",
                       interrupt_data=None)
    if decision.decision == "arguments_changed":
        message = (f"Tool '{name}' was approved for other arguments than this call's, so it did not run. Call it "
                   "again if it is still needed: a reviewer approves that call.")
        return replace(template, status="error", content=message, error_type="approval_arguments_changed",
                       interrupt_data=None)
    if decision.decision == "unavailable":
        message = (f"Tool '{name}' needs a reviewer's approval, and the gateway could not ask for it now (too many "
                   "calls waiting, or its state store unavailable): the call did not run. Try again later.")
        return replace(template, status="error", content=message, error_type="approval_unavailable",
                       interrupt_data=None)
    message = f"Tool '{name}' was waiting for a reviewer's approval when the request ended ({decision.decision})."
    return replace(template, status="error", content=message, error_type=f"approval_{decision.decision}",
                   interrupt_data=None)
