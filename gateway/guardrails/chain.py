"""Guardrails in order: which apply to a call, and running them at each moment.

A call's chain is the gateway's list (the `guardrails` setting), then its tool's (the tool's own
`guardrails`, its registry's, its MCP server's, `tool_guardrails` in the settings), then its
gateway key's, each guardrail once. Before the call, the chain runs in order: a rewrite hands the
next guardrail the new arguments, a deny ends it, an ask makes the call wait for a reviewer once
the chain is done. After the call, a mask hands the next guardrail the masked text, a block ends it.

A built-in (gateway.guardrails.builtin) is cheap and bounded, and runs on the event loop for texts
up to INLINE_MAX_CHARS; any other sync guardrail runs on a thread of the chain's own small pool,
and every guardrail has `timeout` seconds. One that raises or times out has failed, and the
`failure` rule decides: deny (the call does not run, or its result is withheld) or allow.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.guardrails.verdicts import (
    Decision,
    GuardedCall,
    Guardrail,
    GuardrailRecord,
    Moment,
    Verdict,
    checked_verdict,
)

FailureRule = Literal["deny", "allow"]
INLINE_MAX_CHARS = 64 * 1024  # a built-in reads a longer text on a thread, not on the event loop
GUARDRAIL_THREADS = 4  # threads for sync guardrails that are not built-ins


@dataclass(frozen=True)
class Guard:
    """One configured guardrail: its name and its moments (None: it has nothing to say then)."""

    name: str
    before: Callable[[GuardedCall], Any] | None
    after: Callable[[GuardedCall, str], Any] | None
    inline: bool = False  # a built-in: bounded work, run on the event loop for small texts


def guard_of(value: object, name: str) -> Guard:
    """A Guard from a guardrail object: a Guardrail subclass's instance, or any object with a
    `before_execute` and/or an `after_execute` method. A moment a Guardrail subclass does not
    override costs nothing."""
    before = getattr(value, "before_execute", None)
    after = getattr(value, "after_execute", None)
    if isinstance(value, Guardrail):
        kind = type(value)
        before = before if kind.before_execute is not Guardrail.before_execute else None
        after = after if kind.after_execute is not Guardrail.after_execute else None
    elif not callable(before) and not callable(after):
        raise ValueError(f"guardrail {name!r}: {type(value).__name__} has neither before_execute nor after_execute")
    own = getattr(value, "name", "")
    return Guard(own if isinstance(own, str) and own else name, before if callable(before) else None,
                 after if callable(after) else None, bool(getattr(value, "inline", False)))


@dataclass(frozen=True)
class Before:
    """The chain's word before a call: allow (with `arguments` when rewritten), deny (`message`
    is what the model is told) or ask (`message` is what the reviewer is told)."""

    decision: Literal["allow", "deny", "ask"]
    arguments: Mapping[str, Any] | None = None
    message: str | None = None
    records: tuple[GuardrailRecord, ...] = ()
    hidden: tuple[str, ...] = ()


@dataclass(frozen=True)
class After:
    """The chain's word on a result: allow, mask (`result` is the text the model reads) or block
    (`message` is what the model reads instead)."""

    decision: Literal["allow", "mask", "block"]
    result: str | None = None
    message: str | None = None
    records: tuple[GuardrailRecord, ...] = ()
    hidden: tuple[str, ...] = ()


ALLOWED = Before("allow")
PASSED = After("allow")


def _sentence(text: str | None) -> str:
    text = (text or "").strip()
    return text if not text or text.endswith((".", "!", "?")) else text + "."


@dataclass
class Chains:
    """Runs chains of guards; `timeout` and `failure` are the settings' guardrail_timeout_seconds
    and guardrail_failure."""

    timeout: float = 2.0
    failure: FailureRule = "deny"
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _verdict(self, guard: Guard, moment: Moment, fn: Callable[..., Any], args: tuple[Any, ...],
                       size: int) -> tuple[Verdict, str | None]:
        """What `fn` answered, and None; or, when it failed, the failure rule's verdict and how it failed."""
        inline = guard.inline and size <= INLINE_MAX_CHARS
        deadline: asyncio.Timeout | None = None
        try:
            value = fn(*args) if inline else None  # a built-in's bounded work: no deadline to arm
            if not inline or inspect.isawaitable(value):
                deadline = asyncio.timeout(self.timeout)
                async with deadline:
                    value = await value if inspect.isawaitable(value) else await self._called(fn, args)
            return checked_verdict(value, moment), None
        except Exception as exc:
            # the deadline's own TimeoutError, or one the guardrail raised (its client's, say)
            timed_out = isinstance(exc, TimeoutError) and deadline is not None and deadline.expired()
            failed = f"timed out after {self.timeout:g} s" if timed_out else f"raised {type(exc).__name__}"
            kind = "timeout" if timed_out else type(exc).__name__
        if self.failure == "allow":
            return Verdict("allow", f"the guardrail {failed}; guardrail_failure is allow"), kind
        decision: Decision = "deny" if moment == "before" else "block"
        return Verdict(decision, f"the guardrail {failed}; guardrail_failure is deny"), kind

    async def _called(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """What `fn(*args)` answered: awaited when it is async, else run on a thread of the chain's
        pool (and what it returned awaited, when that is awaitable)."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(GUARDRAIL_THREADS, thread_name_prefix="toolspan-guardrail")
        value = await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args))
        return await value if inspect.isawaitable(value) else value

    async def before(self, chain: Sequence[Guard], call: GuardedCall) -> Before:
        """The chain before `call` runs."""
        records: list[GuardrailRecord] = []
        hidden: list[str] = []
        rewritten: Mapping[str, Any] | None = None
        asked: str | None = None  # what the reviewer is told: the first guardrail that asked, and why
        for guard in chain:
            if guard.before is None:
                continue
            size = 0 if guard.inline else INLINE_MAX_CHARS + 1
            verdict, failed = await self._verdict(guard, "before", guard.before, (call,), size)
            records.append(GuardrailRecord(guard.name, "before", verdict.decision, verdict.reason, failed, call.side))
            hidden += verdict.hidden
            if verdict.decision == "deny":
                return Before("deny", None, _denied(call.tool, guard.name, verdict.reason, failed), tuple(records),
                              tuple(hidden))
            if verdict.decision == "rewrite" and verdict.arguments is not None:
                rewritten = verdict.arguments
                call = GuardedCall(call.tool, call.call_id, rewritten, call.side, call.principal,
                                   call.trajectory_id, call.server)
            if verdict.decision == "ask" and asked is None:
                why = _sentence(verdict.reason)
                asked = f"Guardrail '{guard.name}' asks for a reviewer" + (f": {why}" if why else ".")
        return Before("allow" if asked is None else "ask", rewritten, asked, tuple(records), tuple(hidden))

    async def after(self, chain: Sequence[Guard], call: GuardedCall, result: str) -> After:
        """The chain on the text the model is about to read of `call`."""
        records: list[GuardrailRecord] = []
        hidden: list[str] = []
        masked: str | None = None
        for guard in chain:
            if guard.after is None:
                continue
            text = masked if masked is not None else result
            verdict, failed = await self._verdict(guard, "after", guard.after, (call, text), len(text))
            records.append(GuardrailRecord(guard.name, "after", verdict.decision, verdict.reason, failed, call.side))
            hidden += verdict.hidden
            if verdict.decision == "block":
                return After("block", None, _blocked(call.tool, guard.name, verdict.reason, failed), tuple(records),
                             tuple(hidden))
            if verdict.decision == "mask" and verdict.result is not None:
                masked = verdict.result
        return After("allow" if masked is None else "mask", masked, None, tuple(records), tuple(hidden))


def _denied(tool: str, guard: str, reason: str | None, failed: str | None) -> str:
    if failed is not None:
        return (f"Tool '{tool}' was not run: guardrail '{guard}' could not check the call, and a call it cannot "
                f"check is denied. Try again, or go on without it.")
    return (f"Tool '{tool}' was not run: guardrail '{guard}' denied the call. {_sentence(reason)} "
            f"Change the arguments and call '{tool}' again, or go on without it.").replace("  ", " ")


def _blocked(tool: str, guard: str, reason: str | None, failed: str | None) -> str:
    if failed is not None:
        return (f"The result of tool '{tool}' was withheld: guardrail '{guard}' could not check it, and a result "
                "it cannot check is withheld.")
    return f"The result of tool '{tool}' was withheld by guardrail '{guard}'. {_sentence(reason)}".rstrip()

