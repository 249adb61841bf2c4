"""Approvals of tool calls, the gateway's side of gateway.tools.approvals: a call that needs a
reviewer waits here (the executor's ApprovalGate) while its request holds its connection (a
stream keeps alive meanwhile), and the routes list and decide the pending ones.

Pending approvals are in the state store, so a decision made on one replica reaches a call
waiting on another: the waiting call looks for it every `poll_seconds` (at once when it was made in
this process). Whatever ends the wait (a decision, its time limit, the client hanging up, the
gateway shutting down), the approval is no longer pending afterwards. Each names the exact arguments
it asks about by their digest (`arguments_sha256`, gateway.tools.approvals.arguments_digest): a
decision may name it too, and one naming other arguments is refused (a 409 while the approval is
pending; a decision of other arguments that reaches the waiting call anyway runs nothing). Each belongs to the gateway
key whose request asked it: another key cannot see that it exists; the operator's key sees all,
and a key marked `approver` (or the operator's) may decide. Arguments and data are shown with
their secrets masked, by the redact list's rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_jsonable_python

from gateway.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable
from gateway.state.approvals import ApprovalStore
from gateway.tools.approvals import ApprovalAsk, ApprovalDecision, Decided
from gateway.tools.hooks import ToolCallTrace, Turn
from gateway.wire.headers import SecretNames

log = logging.getLogger("toolspan")
APPROVAL_PREFIX = "appr_"
POLL_SECONDS = 0.25  # how often a waiting call looks for a decision made on another replica
MASK = "[REDACTED]"
_STATUS = {"approve": "approved", "deny": "denied", "timeout": "timed_out", "cancelled": "cancelled",
           "shutdown": "cancelled", "unavailable": "cancelled"}


@dataclass(frozen=True)
class Viewer:
    """Who is asking about approvals: the gateway key's name (None without keys), whether it sees
    every key's approvals, and whether it may decide."""

    principal: str | None
    sees_all: bool
    may_decide: bool


def _masked(value: Any, secret: SecretNames) -> Any:
    if isinstance(value, dict):
        return {k: MASK if secret.holds(str(k)) else _masked(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, secret) for v in value]
    return value


def _loaded(text: str | None) -> dict[str, Any] | None:
    """A record or decision as the gateway wrote it; anything else (garbage in Redis) is missing."""
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Approvals:
    """Where calls wait for their reviewer, and what the routes ask of them."""

    store: ApprovalStore
    timeout_seconds: float
    secret: SecretNames
    poll_seconds: float = POLL_SECONDS
    _woken: dict[str, asyncio.Event] = field(default_factory=dict)  # calls waiting in this process
    _ending: bool = False
    _change: asyncio.Event = field(default_factory=asyncio.Event)  # set at the next change in this process

    def next_change(self) -> asyncio.Event:
        """An event set when an approval is next asked, decided or ended in this process: take it
        before looking, then wait on it, and no change goes unseen."""
        return self._change

    def _changed(self) -> None:
        done, self._change = self._change, asyncio.Event()
        done.set()

    # --- the executor's gate ------------------------------------------------------------------------

    async def decided(self, ask: ApprovalAsk, turn: Turn, trace: ToolCallTrace) -> ApprovalDecision:
        limit = ask.timeout if ask.timeout is not None else self.timeout_seconds
        approval_id = APPROVAL_PREFIX + secrets.token_hex(12)
        started = time.monotonic()
        decision = ApprovalDecision("cancelled", 0.0, approval_id)
        try:  # whatever ends it, a hang-up while the approval is being asked included, it is forgotten
            if not await self._asked(approval_id, ask, turn, limit):
                decision = ApprovalDecision("unavailable", 0.0, approval_id)
                return decision
            trace.asked(approval_id)
            woken = self._woken[approval_id] = asyncio.Event()
            self._changed()
            decision = await self._waited(approval_id, woken, started, started + limit, ask.digest)
        finally:
            self._woken.pop(approval_id, None)
            if decision.decision == "cancelled":
                decision = ApprovalDecision("cancelled", time.monotonic() - started, approval_id)
            trace.decided(decision)
            # Shielded: a client that left while it goes still has it go (its cancellation then goes on).
            await asyncio.shield(asyncio.ensure_future(self._forget(approval_id, turn.principal)))
            self._changed()
        return decision

    async def _asked(self, approval_id: str, ask: ApprovalAsk, turn: Turn, limit: float) -> bool:
        now = time.time()
        record = {"id": approval_id, "tool": ask.call.name, "call_id": ask.call.id, "kind": ask.kind,
                  "arguments": _masked(to_jsonable_python(ask.arguments, fallback=repr), self.secret),
                  "arguments_sha256": ask.digest,
                  "message": ask.message, "data": _masked(to_jsonable_python(ask.data, fallback=repr), self.secret),
                  "principal": turn.principal, "trajectory_id": turn.trajectory_id, "created_at": now,
                  "expires_at": now + limit}
        try:
            return await self.store.add(approval_id, json.dumps(record), limit + 60.0, turn.principal)
        except Unavailable:
            return False

    async def _waited(self, approval_id: str, woken: asyncio.Event, started: float, deadline: float,
                      digest: str) -> ApprovalDecision:
        while True:
            found = await self._decision(approval_id)
            if found is not None:
                return self._read(found, approval_id, time.monotonic() - started, digest)
            ending: Decided | None = "shutdown" if self._ending else "timeout" if time.monotonic() >= deadline else None
            if ending is not None:  # unless a reviewer decided at the same moment: the first decision counts
                if await self._settle(approval_id, ending):
                    return ApprovalDecision(ending, time.monotonic() - started, approval_id)
                continue
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
            # lands as its timeout fires, and the call would then wait on for its whole time limit.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self.poll_seconds, max(0.0, deadline - time.monotonic()))):
                    await woken.wait()
            woken.clear()

    async def _decision(self, approval_id: str) -> dict[str, Any] | None:
        try:
            return _loaded(await self.store.decision(approval_id))
        except Unavailable:  # Redis away for now: the wait goes on, to its limit
            return None

    async def _settle(self, approval_id: str, ending: Decided) -> bool:
        try:
            return await self.store.decide(approval_id, json.dumps({"decision": ending}))
        except Unavailable:
            return True

    @staticmethod
    def _read(found: Mapping[str, Any], approval_id: str, waited: float, digest: str) -> ApprovalDecision:
        said = found.get("decision")
        # "unavailable": the store pushed the approval out for another key's (gateway.state.approvals).
        decision: Decided = said if said in ("approve", "deny", "timeout", "shutdown", "unavailable") else "deny"
        named = found.get("arguments_sha256", digest)  # a decision written without one approves what was asked
        if decision == "approve" and named != digest:  # e.g. made on another replica from a stale listing
            decision = "arguments_changed"
        by, reason = found.get("by"), found.get("reason")
        return ApprovalDecision(decision, waited, approval_id, by if isinstance(by, str) else None,
                                reason if isinstance(reason, str) else None, found.get("output"),
                                bool(found.get("has_output")))

    async def _forget(self, approval_id: str, principal: str | None) -> None:
        try:
            await self.store.remove(approval_id, principal)
        except Unavailable:  # it expires with its time limit
            log.info("approval %s not removed (state store unavailable): it expires by itself", approval_id)

    def end(self) -> None:
        """The gateway is shutting down: every call waiting here stops waiting (decision "shutdown")."""
        self._ending = True
        for woken in self._woken.values():
            woken.set()

    # --- what the routes ask ------------------------------------------------------------------------

    @staticmethod
    def _visible(record: Mapping[str, Any], viewer: Viewer) -> bool:
        return viewer.sees_all or record.get("principal") == viewer.principal

    @staticmethod
    def _shown(record: Mapping[str, Any], decision: Mapping[str, Any] | None, viewer: Viewer) -> dict[str, Any]:
        shown = {k: record.get(k) for k in ("id", "tool", "call_id", "kind", "arguments", "arguments_sha256",
                                            "message", "data", "trajectory_id", "created_at", "expires_at")}
        said = decision.get("decision") if decision is not None else None
        shown.update(object="tool.approval", status=_STATUS.get(str(said), "pending") if said else "pending")
        if viewer.sees_all and record.get("principal") is not None:
            shown["key"] = record["principal"]
        return shown

    async def pending(self, viewer: Viewer) -> list[dict[str, Any]]:
        """The pending approvals this viewer may see, oldest first."""
        listed, now = [], time.time()
        for _, text, decided in await self.store.held():
            record = _loaded(text)
            if record is None or decided is not None or not self._visible(record, viewer):
                continue
            expires = record.get("expires_at")  # past it, the call no longer waits (its replica may have died)
            if not isinstance(expires, int | float) or expires > now:
                listed.append(self._shown(record, None, viewer))
        return sorted(listed, key=lambda shown: float(shown.get("created_at") or 0))

    async def one(self, approval_id: str, viewer: Viewer) -> dict[str, Any]:
        """One approval this viewer may see; a 404 for any other, as for one that does not exist."""
        found = await self.store.get(approval_id) if approval_id.startswith(APPROVAL_PREFIX) else None
        record = _loaded(found[0]) if found is not None else None
        if found is None or record is None or not self._visible(record, viewer):
            raise NotFound(f"no approval with id '{approval_id[:80]}' is pending", code="approval_not_found")
        return self._shown(record, _loaded(found[1]), viewer)

    async def decide(self, approval_id: str, viewer: Viewer, decision: str, *, reason: str | None = None,
                     output: Any = None, has_output: bool = False,
                     arguments_sha256: str | None = None) -> dict[str, Any]:
        """Decide one pending approval; a 409 when it was decided (or ended) already, or when the
        decision names (by `arguments_sha256`) other arguments than the approval's, which then stays pending."""
        shown = await self.one(approval_id, viewer)
        if has_output and shown.get("kind") != "interrupt":
            raise BadRequest("an output is the result of a call whose tool paused (kind interrupt); this call asks "
                             "before it runs, and its body gives the result", param="output", code="output_not_taken")
        if not viewer.may_decide:
            raise Forbidden("this gateway key may not decide approvals: it needs `approver` (or `operator`)",
                            code="not_an_approver")
        if shown["status"] != "pending":
            raise Conflict(f"approval '{approval_id}' was decided already", code="approval_decided")
        if arguments_sha256 is not None and arguments_sha256 != shown.get("arguments_sha256"):
            raise Conflict(f"approval '{approval_id}' asks about other arguments than the ones this decision names "
                           "(its arguments_sha256 differs): read it again and decide on what it shows",
                           param="arguments_sha256", code="arguments_changed")
        said = {"decision": decision, "by": viewer.principal, "reason": reason, "output": output,
                "has_output": has_output}
        if isinstance(shown.get("arguments_sha256"), str):  # the waiting call checks it is the one it asked about
            said["arguments_sha256"] = shown["arguments_sha256"]
        if not await self.store.decide(approval_id, json.dumps(said)):
            raise Conflict(f"approval '{approval_id}' was decided already", code="approval_decided")
        if (woken := self._woken.get(approval_id)) is not None:
            woken.set()
        self._changed()
        return {**shown, "status": _STATUS[decision]}
