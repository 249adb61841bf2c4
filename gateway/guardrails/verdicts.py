"""The guardrail API: what a guardrail is shown of a call, and what it may answer.

A guardrail has up to two moments. `before_execute(call)` sees a call whose arguments passed the
parse step and answers allow, deny(reason), rewrite(arguments) or ask(reason) (a reviewer's
approval first). `after_execute(call, result)` sees the text the model is about to read and
answers allow, block(reason) or mask(result). Either may also flag(reason): the call goes on, and
the finding is recorded. Returning None is allow. Both may be sync or async.

`hidden` on a verdict lists values the guardrail found that nothing the gateway records may show
(a credential in the arguments of a denied call): spans, log records and the store mask them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

Moment = Literal["before", "after"]
Side = Literal["gateway", "client"]  # whose tool: as gateway.tools.hooks.Side, which this room sits below
Decision = Literal["allow", "deny", "rewrite", "ask", "block", "mask", "flag"]
BEFORE_DECISIONS: frozenset[Decision] = frozenset({"allow", "deny", "rewrite", "ask", "flag"})
AFTER_DECISIONS: frozenset[Decision] = frozenset({"allow", "block", "mask", "flag"})


@dataclass(frozen=True)
class GuardedCall:
    """One tool call as a guardrail sees it. `arguments` are the parsed arguments of a gateway
    tool's call; of a client tool's call (`side="client"`), its arguments as JSON decoded (an
    empty dict when they are not a JSON object). `server` names the MCP server of an MCP tool."""

    tool: str
    call_id: str
    arguments: Mapping[str, Any]
    side: Side = "gateway"
    principal: str | None = None
    trajectory_id: str | None = None
    server: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A guardrail's answer: build it with allow(), deny(), rewrite(), ask(), block(), mask() or flag()."""

    decision: Decision
    reason: str | None = None
    arguments: Mapping[str, Any] | None = None  # rewrite: the arguments the tool gets instead
    result: str | None = None  # mask: the text the model reads instead
    hidden: tuple[str, ...] = ()  # values nothing the gateway records may show


def allow() -> Verdict:
    return Verdict("allow")


def deny(reason: str, hidden: tuple[str, ...] = ()) -> Verdict:
    """The call does not run; the model is told `reason`, which should say what to change."""
    return Verdict("deny", reason, hidden=hidden)


def rewrite(arguments: Mapping[str, Any], reason: str | None = None) -> Verdict:
    """The call runs with `arguments` instead (they pass the tool's parse step again)."""
    return Verdict("rewrite", reason, arguments=dict(arguments))


def ask(reason: str | None = None) -> Verdict:
    """The call waits for a reviewer's approval, as a tool declared with approval=True does."""
    return Verdict("ask", reason)


def block(reason: str) -> Verdict:
    """The model does not read the result; it is told `reason` instead."""
    return Verdict("block", reason)


def mask(result: str, reason: str | None = None, hidden: tuple[str, ...] = ()) -> Verdict:
    """The model reads `result` in place of the tool's."""
    return Verdict("mask", reason, result=result, hidden=hidden)


def flag(reason: str) -> Verdict:
    """The call goes on as it is; the finding is recorded (spans, metrics, store)."""
    return Verdict("flag", reason)


Answer = Verdict | None | Awaitable[Verdict | None]


class Guardrail:
    """A guardrail to subclass: override either moment (each allows by default). `name` is how
    spans, metrics and the page name it; unset, the settings' name for it (its import path)."""

    name: str = ""

    def before_execute(self, call: GuardedCall) -> Answer:
        return None

    def after_execute(self, call: GuardedCall, result: str) -> Answer:
        return None


@dataclass(frozen=True)
class GuardrailRecord:
    """One guardrail's decision on one call, as telemetry records it. `failed`: the guardrail
    raised or timed out ("timeout", or the exception's type), and the decision is the
    guardrail_failure rule's."""

    guardrail: str
    moment: Moment
    decision: Decision
    reason: str | None = None
    failed: str | None = None
    side: Side = "gateway"


def checked_verdict(value: object, moment: Moment) -> Verdict:
    """A guardrail's answer as a Verdict: None is allow; anything else, or a decision of the other
    moment, is a TypeError (the guardrail failed)."""
    if value is None:
        return Verdict("allow")
    if not isinstance(value, Verdict):
        raise TypeError(f"a guardrail returned {type(value).__name__}, not a Verdict (use allow(), deny() ...)")
    allowed = BEFORE_DECISIONS if moment == "before" else AFTER_DECISIONS
    if value.decision not in allowed:
        raise TypeError(f"{value.decision} is not a decision of {moment}_execute")
    if value.decision == "rewrite" and not isinstance(value.arguments, Mapping):
        raise TypeError("rewrite needs the arguments as a dict")
    if value.decision == "mask" and not isinstance(value.result, str):
        raise TypeError("mask needs the result as text")
    return value if value.hidden == () else replace(value, hidden=_hidden_values(value.hidden))


def _hidden_values(hidden: object) -> tuple[str, ...]:
    """`hidden` as a tuple of values to mask: one string is one value (not its characters), and an
    empty one is dropped (it would be found between any two characters)."""
    if hidden is None:
        return ()
    values = (hidden,) if isinstance(hidden, str) else tuple(hidden) if isinstance(hidden, Iterable) else None
    if values is None or not all(isinstance(found, str) for found in values):
        raise TypeError("hidden needs the values to mask as strings")
    return tuple(found for found in values if found)
