"""What the gateway remembers between requests: mixed turns held for the client's follow-up, the
provider response a client-facing response id stands for, which gateway key made which provider
response, and the last failed call of each tool in a trajectory (telemetry classifies retries by
it, see telemetry.trajectory).

When one model turn calls both gateway tools and client tools, the client only sees its own
calls. The gateway keeps its part (its calls and their results) under a token, and gives the
client's calls ids that name the token, so that the turn can be put together again when the
conversation comes back. Entries are bounded in number (in all and per gateway key, with the
rule of gateway.state.fair for what goes when a table is full), expire when unused, and belong to
the gateway key that made them: another key never finds them.

Each kind of entry is a typed table (gateway.state.store) over one primitive, owned maps
(gateway.state.maps), kept in this process's memory (`MemoryState`, the default) or in a Redis
that replicas share (`RedisState`, `state_url`). A request first looks up, in one go, what it
names (`StateStore.lookup`: tokens, ids of shown items, a response id); the conversation is then
put back from that `Found`, synchronously. A store that cannot answer raises `StateUnavailable`
(a 503 with retry-after), never a wrong history. What Redis holds that is not what the gateway
wrote there (gateway.state.redis_values) is treated as missing, counted and logged, never a 500.
The failure records, the pending approvals and the upstreams' cooldowns (`StateStore.cooldowns`)
are stores of their own beside the tables (their modules say why). Failure records are opaque text
here: their shape is telemetry's.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.state.approvals import PENDING_APPROVALS, ApprovalBounds
from gateway.state.base import (
    NOTHING,
    OWNED_RESPONSES,
    PREFIX,
    RESPONSE_PREFIX,
    Bounds,
    FailureBook,
    FailureBounds,
    Found,
    HeldTurn,
    StateKind,
    StateUnavailable,
    approval_id,
    client_call_id,
    no_such_response,
    split_approval_id,
    split_call_id,
)
from gateway.state.maps import OwnedMap, OwnedMaps, Table
from gateway.state.memory import FailureRecords, MemoryState
from gateway.state.redis_store import RedisState
from gateway.state.store import StateStore

__all__ = ["NOTHING", "OWNED_RESPONSES", "PREFIX", "RESPONSE_PREFIX", "ApprovalBounds", "Bounds", "FailureBook",
           "FailureBounds", "FailureRecords", "Found", "HeldTurn", "MemoryState", "OwnedMap", "OwnedMaps",
           "RedisState", "StateKind", "StateStore", "StateUnavailable", "Table",
           "approval_id", "client_call_id", "make_store", "no_such_response", "split_approval_id", "split_call_id"]


def make_store(url: str | None, turns: Bounds, owned: Bounds, timeout_seconds: float,
               observe: Callable[[bool], None], lost: Callable[[], None] = lambda: None,
               unreadable: Callable[[StateKind], None] = lambda kind: None,
               approvals: ApprovalBounds = PENDING_APPROVALS) -> StateStore:
    """The store `state_url` names: None, memory; redis:// (rediss://, unix://), Redis. Failure
    records keep `FailureRecords`' default bounds either way. `unreadable` hears of each value read
    from Redis that is not what the gateway wrote (memory holds only what the gateway put there)."""
    if url is None:
        return MemoryState(turns.capacity, turns.ttl_seconds, per_key=turns.per_key, owned=owned, approvals=approvals)
    return RedisState(url, turns.capacity, turns.ttl_seconds, timeout_seconds, observe, lost=lost,
                      per_key=turns.per_key, owned=owned, unreadable=unreadable, approvals=approvals)
