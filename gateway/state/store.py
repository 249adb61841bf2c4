"""The state store: each kind of entry the gateway keeps between requests, a typed table over one
`OwnedMaps` (gateway.state.maps), with the failure records, the pending approvals, the upstreams'
cooldowns and the counts of the keys' limits beside them.
A new kind is one table here; its callers use it through the table's verbs."""

from __future__ import annotations

import secrets
from collections.abc import Collection

from gateway.limits.windows import LimitBook, MemoryLimitBook
from gateway.provider.cooldowns import CooldownRule, Cooldowns, MemoryCooldowns
from gateway.state.approvals import ApprovalStore
from gateway.state.base import (
    OWNED_RESPONSES,
    REPLAYS,
    SENT_CALLS,
    TRAJECTORY_LINKS,
    Bounds,
    FailureBook,
    Found,
    HeldTurn,
)
from gateway.state.maps import OwnedMap, OwnedMaps, Table
from gateway.state.redis_values import (
    answer_of,
    owned_json,
    owned_of,
    response_of,
    rounds_of,
    sent_of,
    thread_of,
    token_of,
    trajectory_of,
    turn_json,
    turn_of,
    upstream_of,
)


def _text(value: str) -> str:
    return value


class StateStore:
    """The tables, whichever the maps are (memory or Redis). A table's name is its kind in Redis's
    keys and in the count of unreadable values; the held turns' bounds (`turns`) are also those of
    the entries that live as long as a turn's follow-up may come (shown items, aliases, answer
    records, threads)."""

    def __init__(self, maps: OwnedMaps, failures: FailureBook, approvals: ApprovalStore, turns: Bounds,
                 owned: Bounds = OWNED_RESPONSES) -> None:
        self.maps = maps
        # A held turn by its token (gateway.engine.run holds it, gateway.apis put it back).
        self.turns = OwnedMap(maps, Table("turn", turns, turn_json, turn_of))
        # The token of the held turn whose client saw the item of this id (Responses).
        self.shown = OwnedMap(maps, Table("item", turns, _text, token_of))
        # The provider response a response id the gateway made up continues at.
        self.aliases = OwnedMap(maps, Table("resp", turns, _text, response_of))
        # The provider responses the principal (a gateway key) made: only it may read, continue or delete them.
        self.owners = OwnedMap(maps, Table("own", owned, owned_json, owned_of))
        # The trajectory a call or response id of an answer belongs to (gateway.routes.linking).
        self.links = OwnedMap(maps, Table("link", TRAJECTORY_LINKS, _text, trajectory_of))
        # What the client was given under a response id the gateway made (gateway.routes.answer_records).
        self.answers = OwnedMap(maps, Table("answer", turns, _text, answer_of))
        # A Messages thread's conversation by the id of the answer ending it (gateway.apis.messages.threads).
        self.threads = OwnedMap(maps, Table("thread", turns, _text, thread_of))
        # The rounds of a request that failed after gateway tools ran, by its digest (gateway.engine.replays).
        self.replays = OwnedMap(maps, Table("rounds", REPLAYS, _text, rounds_of))
        # A client call handed back, by its id as the client got it (gateway.client_tools.results).
        self.sent = OwnedMap(maps, Table("sent", SENT_CALLS, _text, sent_of))
        # The upstream that made a provider response, with several upstreams: its continuations, reads
        # and deletion go there (gateway.engine.rounds, gateway.routes.response_ids).
        self.origins = OwnedMap(maps, Table("origin", owned, _text, upstream_of))
        self.failures = failures  # the retry state (telemetry.trajectory), a store of its own
        self.approvals = approvals  # pending approvals of tool calls (gateway.tools.approval_gate)

    async def hold(self, turn: HeldTurn, principal: str | None) -> str:
        """Keep `turn`, and the items its client saw; returns the token its client calls' ids carry
        (see `client_call_id`)."""
        token = secrets.token_hex(6)
        await self.maps.put(principal, self.turns.entries({token: turn}),
                            self.shown.entries(dict.fromkeys(turn.shown, token)))
        return token

    async def lookup(self, principal: str | None, tokens: Collection[str], item_ids: Collection[str] = (),
                     response_id: str | None = None) -> Found:
        """The held turns of these tokens and of these shown items, and the response behind
        `response_id` (and whether the principal made it), each as the principal's own and with its
        expiry refreshed: the shown items, the alias and the owner in one read, then the turns."""
        named = () if response_id is None else (response_id,)
        first = await self.maps.get(principal, self.shown.at(item_ids), self.aliases.at(named),
                                    self.owners.at(named))
        owners = first.of(self.shown.table)
        turns = await self.turns.get(principal, dict.fromkeys([*tokens, *owners.values()]))
        if response_id is None:
            return Found(turns, owners)
        response = first.of(self.aliases.table).get(response_id)
        owned = response is not None or first.of(self.owners.table).get(response_id, False)
        return Found(turns, owners, response, owned)

    def cooldowns(self, rule: CooldownRule) -> Cooldowns:
        """The record of upstreams cooling down by `rule`, kept where this store keeps the rest: in
        this process's memory, or (RedisState) in the Redis replicas share. Made once, at start-up."""
        return MemoryCooldowns(rule)

    def limit_book(self) -> LimitBook:
        """The counts of the gateway keys' limits, kept where this store keeps the rest: in this
        process's memory, or (RedisState) in the Redis replicas share. Made once, at start-up."""
        return MemoryLimitBook()

    async def status(self) -> str | None:
        """None for a store in memory; else "up" or "unavailable"."""
        return await self.maps.status()

    async def aclose(self) -> None:
        await self.maps.aclose()
