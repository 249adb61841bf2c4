"""Replay: the tool calls a store recorded, their arguments as the model sent them, parsed again
against tools as they are now (a registry, a tool file, the schemas a client declares), so that
before a change ships one sees which recorded rejections it would let through and which recorded
passes it would refuse. Only the parse step runs (a tool's parse_args, its args_model, its schema
check): never a tool's body.

What a recorded call counts as:
- a pass: any outcome but `rejected` (the body ran, `repaired` included, or would have but for an
  approval, a timeout or the client), and a rejection by a guardrail (`guardrail_denied`: guardrails
  decide on arguments the parse step took);
- a rejection: `rejected` by the parse step (invalid_json, missing_arguments, schema_violation,
  parser) or by the lookup (unknown_tool: when the target has the tool now, the call is parsed);
- neither, and not replayed: `not_allowed` (the key's allowlist refused it, whatever the tool) and
  a call without an outcome.
A call is not replayed either when its arguments were not recorded (the gateway records them on
rejections only, unless record_tool_arguments is on), when they were cut to length, when the
target has no such tool, or no schema for the client's (`no_schema`), or when it cannot check
them (`unchecked`: a schema past the bounds of a check). A masked value (redact_keys) is replayed
as the mask stands; a call holding one whose verdict changes is `uncertain`, neither fixed nor
broken, since the mask stands for a value of a type nobody knows."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

PARSE_REASONS = frozenset({"invalid_json", "missing_arguments", "schema_violation", "parser", "unknown_tool"})
PASSED_REASONS = frozenset({"guardrail_denied"})  # refused after the parse step took the arguments
EXAMPLES = 5  # calls shown of each tool's broken ones, and of its fixed ones
# The longest a replay holds the event loop before it gives it a turn: one call's parse step may
# spend several check budgets (parse, repair's schema check, parse again), so calls are not counted.
PAUSE_SECONDS = 0.005

Changed = Literal["fixed", "broken", "still_passing", "still_rejected", "uncertain"]
CHANGES: tuple[Changed, ...] = ("fixed", "broken", "still_passing", "still_rejected", "uncertain")
# Why a call was not replayed, in the order a call is looked at.
NOT_REPLAYED = ("no_outcome", "not_allowed", "no_schema", "not_in_target", "not_recorded", "cut", "unchecked")


@dataclass(frozen=True)
class RecordedCall:
    """One recorded call, as the store's reader hands it (telemetry.store.recorded.recorded_calls)."""

    tool: str
    side: str  # "gateway" or "client"
    outcome: str | None
    reason: str | None  # the recorded rejection's
    arguments: str | None  # as recorded: None when they were not
    cut: bool  # the recorded arguments are the start of longer ones
    masked: bool  # a value in them may be the mask
    trajectory: str  # its id in the store
    key: str | None
    local_id: str
    span_id: str
    trace_id: str
    call_id: str | None
    started: float

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> RecordedCall:
        return cls(tool=str(row["tool"]), side=str(row.get("side") or "gateway"), outcome=row.get("outcome"),
                   reason=row.get("rejection_reason"), arguments=row.get("arguments"), cut=bool(row.get("cut")),
                   masked=bool(row.get("masked")), trajectory=str(row["id"]), key=row.get("key"),
                   local_id=str(row.get("local_id") or row["id"]), span_id=str(row["span_id"]),
                   trace_id=str(row["trace_id"]), call_id=row.get("call_id"), started=float(row["started"]))

    @property
    def recorded_pass(self) -> bool | None:
        """Whether the call passed the parse step when it was made; None: the record cannot say."""
        if self.outcome is None:
            return None
        if self.outcome != "rejected":
            return True
        if self.reason in PASSED_REASONS:
            return True
        return False if self.reason in PARSE_REASONS else None


@dataclass(frozen=True)
class Verdict:
    """A replayed call's parse step: passed (maybe once repaired), or rejected with the reason and the
    model-facing text."""

    passed: bool
    reason: str | None = None
    message: str | None = None
    repaired: bool = False  # it passes on arguments argument repair mended


class Target(Protocol):
    """What calls are replayed against."""

    @property
    def description(self) -> str: ...

    def covers(self, call: RecordedCall) -> Literal["no_schema", "not_in_target"] | None:
        """Why the target cannot replay `call` (None: it can)."""

    async def parse(self, call: RecordedCall) -> Verdict | None:
        """The parse step of `call`'s recorded arguments; None when the target cannot check them."""


@dataclass
class _Tally:
    """One tool's counts, and the examples kept of its changed calls."""

    tool: str
    side: str
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"broken": [], "fixed": []})

    def add(self, call: RecordedCall, kind: str, verdict: Verdict | None, examples: int) -> None:
        self.counts[kind] += 1
        self.counts["repaired"] += verdict is not None and verdict.repaired
        kept = self.examples.get(kind)
        if kept is not None and verdict is not None and len(kept) < examples:
            kept.append(_example(call, verdict))

    def figures(self) -> dict[str, Any]:
        return {"tool": self.tool, "side": self.side, **_totals(self.counts),
                "broken_examples": self.examples["broken"], "fixed_examples": self.examples["fixed"]}


def _example(call: RecordedCall, verdict: Verdict) -> dict[str, Any]:
    return {"id": call.trajectory, "key": call.key, "local_id": call.local_id, "span_id": call.span_id,
            "trace_id": call.trace_id, "started": call.started, "arguments": call.arguments,
            "recorded_outcome": call.outcome, "recorded_reason": call.reason,
            "now_reason": verdict.reason, "now_message": verdict.message}


def _totals(counts: Counter[str]) -> dict[str, Any]:
    replayed = sum(counts[kind] for kind in CHANGES)
    return {"calls": replayed + sum(counts[why] for why in NOT_REPLAYED), "replayed": replayed,
            **{kind: counts[kind] for kind in CHANGES}, "repaired": counts["repaired"],
            "not_replayed": {why: counts[why] for why in NOT_REPLAYED if counts[why]}}


async def replayed(call: RecordedCall, target: Target) -> tuple[str, Verdict | None]:
    """What became of one call: a kind of CHANGES with the verdict, or why it was not replayed."""
    before = call.recorded_pass
    if before is None:
        return ("not_allowed" if call.reason == "not_allowed" else "no_outcome"), None
    if (why := target.covers(call)) is not None:
        return why, None
    if call.arguments is None:
        return "not_recorded", None
    if call.cut:
        return "cut", None
    verdict = await target.parse(call)
    if verdict is None:
        return "unchecked", None
    if verdict.passed == before:
        return ("still_passing" if before else "still_rejected"), verdict
    if call.masked:
        return "uncertain", verdict
    return ("broken" if before else "fixed"), verdict


async def replay(calls: Iterable[RecordedCall], target: Target, examples: int = EXAMPLES,
                 seconds: float | None = None, clock: Callable[[], float] | None = None) -> dict[str, Any]:
    """Every call replayed against `target`: the totals and the same per tool (most broken first,
    then most fixed, then most calls), with up to `examples` of each tool's broken and fixed calls
    (the first met: the newest, as the store hands them). With `seconds`, the replay stops when they
    have passed, "partial" then true and the figures those of the calls looked at by then. Whenever
    PAUSE_SECONDS have passed since the last (by `clock`, the loop's by default), the event loop gets
    a turn: a user's parser may be slow.

    {"target", "calls", "replayed", "fixed", "broken", "still_passing", "still_rejected", "uncertain",
     "repaired" (of the calls that pass now, those that pass once argument repair mends them),
     "not_replayed": {why: n}, "partial", "tools": [{"tool", "side", the same counts, "broken_examples",
     "fixed_examples": [{"id", "key", "local_id", "span_id", "trace_id", "started", "arguments",
     "recorded_outcome", "recorded_reason", "now_reason", "now_message"}]}]}"""
    tallies: dict[tuple[str, str], _Tally] = {}
    overall: Counter[str] = Counter()
    now = clock if clock is not None else asyncio.get_running_loop().time
    started = paused = now()
    partial = False
    for call in calls:
        if seconds is not None and now() - started >= seconds:
            partial = True
            break
        kind, verdict = await replayed(call, target)
        overall[kind] += 1
        overall["repaired"] += verdict is not None and verdict.repaired
        tally = tallies.get((call.tool, call.side))
        if tally is None:
            tally = tallies[(call.tool, call.side)] = _Tally(call.tool, call.side)
        tally.add(call, kind, verdict, examples)
        if now() - paused > PAUSE_SECONDS:
            await asyncio.sleep(0)
            paused = now()
    tools = sorted((tally.figures() for tally in tallies.values()),
                   key=lambda f: (-f["broken"], -f["fixed"], -f["calls"], f["tool"], f["side"]))
    return {"target": target.description, **_totals(overall), "partial": partial, "tools": tools}
