"""A request replayed after it failed for good once gateway tools had run resumes after them.

When the provider still fails after the gateway's own retries (gateway.engine.retries), the client
is told not to resend; an application may still do so (its own retry loop, a user's "try again").
The rounds done so far, each the model's answer and the outcomes of the gateway's calls in it, are
then kept in the state store under a digest of the request and the caller's key, for REPLAYS' time.
The same request again (the same first provider request: same messages or input, tools, model and
options) takes them: the gateway goes on from the round that failed, and no tool runs twice. The
record is read once; a request that ends well keeps nothing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.engine.plan import Plan
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.errors import GatewayError
from gateway.state import StateStore
from gateway.tools import ToolOutcome

log = logging.getLogger("toolspan")
VERSION = 1  # of the record's shape: a record of another version is not read


@dataclass(frozen=True)
class Round:
    """One round done: the model's answer, the outcomes of the gateway's calls in it, and (for a
    stream) the pieces of it the client saw as it streamed."""

    turn: ModelTurn
    outcomes: tuple[ToolOutcome, ...]
    pieces: tuple[Mapping[str, Any], ...] = ()


def request_key(plan: Plan) -> str:
    """The digest a request is known by for replays: its API and first provider request, which
    hold everything the client sent that the rounds depend on."""
    first = plan.conversation.request(False, plan.stream)
    return hashlib.sha256(orjson.dumps([plan.api.name, first], option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Replays:
    """The rounds of one request, for a replay of it: those it resumed from, and those it did."""

    store: StateStore  # its `replays` table holds the records, by request key
    principal: str | None
    plan: Plan
    rounds: list[Round] = field(default_factory=list)

    @functools.cached_property
    def key(self) -> str:
        """request_key of the plan: made only when a replay is looked for or kept, since most
        requests do neither (a request offered no gateway tools ran none)."""
        return request_key(self.plan)

    async def resumed(self) -> list[Round]:
        """The rounds a failed run of this same request did, if the store holds them (taken)."""
        if not self.store.replays.may_hold():  # a store in memory that holds none: the digest is not made
            return []
        try:
            record = (await self.store.replays.take(self.principal, [self.key])).get(self.key)
        except GatewayError:  # Redis down: a request that needs no state runs on, afresh
            return []
        if record is None:
            return []
        try:
            found = _rounds(orjson.loads(record))
        except (ValueError, KeyError, TypeError):
            log.warning("a replay record could not be read; the request runs afresh")
            return []
        self.rounds = list(found)
        return self.rounds

    def done(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], pieces: Sequence[Mapping[str, Any]]) -> None:
        self.rounds.append(Round(turn, tuple(outcomes), tuple(pieces)))

    async def keep(self) -> bool:
        """Keep the rounds for a replay; whether there were any (and the store took them)."""
        if not self.rounds:
            return False
        record = {"v": VERSION, "rounds": [_round_record(r) for r in self.rounds]}
        try:
            await self.store.replays.put(self.principal, {self.key: orjson.dumps(record).decode()})
        except Exception:  # the failure the client hears of matters more than its replay
            log.warning("the rounds of a failed request could not be kept for its replay", exc_info=True)
            return False
        return True


def _round_record(done: Round) -> dict[str, Any]:
    turn = done.turn
    # The provider's header names come as aiohttp's case-insensitive strings, which JSON encoders
    # refuse as keys: written as plain strings.
    headers = {str(name): str(value) for name, value in turn.headers.items()}
    return {"turn": {"api": turn.api, "body": turn.body, "output": turn.output, "finish_reason": turn.finish_reason,
                     "usage": turn.usage, "headers": headers, "input_tokens": turn.input_tokens,
                     "output_tokens": turn.output_tokens,
                     "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "item": c.item, "kind": c.kind}
                               for c in turn.calls]},
            "outcomes": [{"call_id": o.call_id, "tool_name": o.tool_name, "status": o.status, "content": o.content,
                          "display_text": o.display_text} for o in done.outcomes],
            "pieces": list(done.pieces)}


def _rounds(record: Any) -> tuple[Round, ...]:
    if record["v"] != VERSION:
        raise ValueError("another version")
    return tuple(Round(_turn(r["turn"]), tuple(ToolOutcome(**o) for o in r["outcomes"]), tuple(r["pieces"]))
                 for r in record["rounds"])


def _turn(raw: Mapping[str, Any]) -> ModelTurn:
    calls = tuple(ModelCall(c["id"], c["name"], c["arguments"], c["item"], c["kind"]) for c in raw["calls"])
    return ModelTurn(raw["api"], raw["body"], tuple(raw["output"]), calls, raw["finish_reason"], raw["usage"],
                     raw["headers"], raw.get("input_tokens"), raw.get("output_tokens"))
