"""Which trajectory a request belongs to when its caller names none: no client library sends
X-Trajectory-Id, yet most requests of an agent's run say which run they continue. A request joins
the trajectory of a response it continues (`previous_response_id`) or of a call whose result it
carries (any call id of an answer the gateway gave); else a client's own session header names it
(hashed with the gateway key, so two keys never share one); else it starts a new trajectory.

Every link belongs to the gateway key that made it: another key's request with the same ids
finds nothing. Links are best effort: a state store that cannot be reached leaves the request in
the trajectory it would otherwise have (the request itself goes on)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any, Protocol

from gateway.caller import Caller
from gateway.client_tools import results as client_results
from gateway.engine.events import Event, Finished
from gateway.errors import Unavailable
from gateway.state import StateStore

log = logging.getLogger("toolspan")

# Client session headers, in the order they are trusted, each sent on every request of one run:
# Claude Code's; the Codex CLI's (`session-id` and `thread-id` from 0.1xx on, `session_id` and
# `conversation_id` before). The OpenAI Agents SDK and openai-python send none of their own.
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "thread-id", "conversation_id")
# The latest call ids of a conversation that are looked up: the run's latest answer gave them, and
# a conversation of hundreds of calls would otherwise read hundreds of keys on every request.
LATEST_CALLS = 8
_CALL = "call:"  # link kinds: a call id the client was given, a response id it was given
_RESPONSE = "resp:"


def described(caller: Caller, metadata: object, named: str | None) -> Caller:
    """`caller` as a request's `metadata` describes it: the metadata reaches tools, and the
    trajectory it names (`named`, checked: wire.headers.named_trajectory) counts when the header
    named none."""
    if not isinstance(metadata, dict):
        return caller
    if caller.trajectory_named or named is None:
        return replace(caller, metadata=metadata)
    return replace(caller, metadata=metadata, trajectory_id=named, linked_by="metadata")


def session_trajectory(principal: str | None, headers: Mapping[str, str]) -> str | None:
    """The trajectory a client session header names, as this gateway key's: a digest of both."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            named = json.dumps([principal, name, value]).encode("utf-8", "surrogatepass")
            return hashlib.sha256(named).hexdigest()[:32]
    return None


def by_session(caller: Caller, headers: Mapping[str, str]) -> Caller:
    """`caller` in the trajectory its client session header names, if it named none itself: so
    every request of a run, passed through or refused ones included, is in the run's trajectory."""
    if caller.trajectory_source != "new" or (session := session_trajectory(caller.principal, headers)) is None:
        return caller
    return replace(caller, trajectory_id=session, linked_by="session_header")


async def joined(caller: Caller, state: StateStore, call_ids: Sequence[str], previous_response_id: str | None = None,
                 metadata: object = None, named: str | None = None) -> Caller:
    """`caller` (as the request's `metadata` describes it) in the trajectory its request continues,
    and how that was found; a caller that named its trajectory (header, metadata) stays in it, and
    one whose request continues nothing the gateway answered stays in its session's (`by_session`,
    which the middleware applied)."""
    if metadata is not None:
        caller = described(caller, metadata, named)
    if caller.trajectory_source not in ("new", "session_header"):
        return caller
    try:
        if previous_response_id is not None and (
                found := await _linked(state, caller, [_RESPONSE + previous_response_id])):
            return replace(caller, trajectory_id=found, linked_by="previous_response")
        latest = [_CALL + i for i in dict.fromkeys(call_ids[:LATEST_CALLS])]
        if latest and (found := await _linked(state, caller, latest)):
            return replace(caller, trajectory_id=found, linked_by="call_ids")
    except Unavailable:
        log.info("trajectory links unavailable (state store): the request's trajectory is not looked up")
    return caller


async def _linked(state: StateStore, caller: Caller, ids: Sequence[str]) -> str | None:
    """The trajectory the first of these ids that the caller's key linked belongs to, if any."""
    found = await state.links.get(caller.principal, ids)
    return next(iter(found.values()), None)


async def remember(state: StateStore, caller: Caller, call_ids: Iterable[str], response_id: str | None) -> None:
    """Link the ids of an answer the client is about to get to the caller's trajectory, so that
    the requests continuing from it join that trajectory."""
    ids = [_CALL + i for i in call_ids]
    if response_id is not None:
        ids.append(_RESPONSE + response_id)
    if not ids:
        return
    try:
        await state.links.put(caller.principal, dict.fromkeys(ids, caller.trajectory_id))
    except Unavailable:
        log.info("trajectory links unavailable (state store): this answer's ids are not linked")


class Answering(Protocol):
    """What linking needs of a wire API: whether its answer's id is one a later request continues
    from, and the (call id, tool) of a client call as its client gets it."""

    @property
    def continues_by_id(self) -> bool: ...

    def handed(self, call: Mapping[str, Any]) -> tuple[str, str] | None: ...


async def remembered(events: AsyncGenerator[Event, None], state: StateStore, caller: Caller, api: Answering,
                     keep_handed: bool) -> AsyncGenerator[Event, None]:
    """`events`, and before the answer reaches its client (who may continue from it at once) its
    call and response ids linked to the caller's trajectory; with `keep_handed` (the client's calls
    are checked), the client calls it hands over kept for their results to find
    (gateway.client_tools.results)."""
    async with aclosing(events) as running:
        async for event in running:
            if isinstance(event, Finished):
                # Only an id a later request can continue from (Responses') links.
                response_id = event.response_id if api.continues_by_id else None
                handed = [found for call in event.client_calls if (found := api.handed(call)) is not None]
                # an item handed that is no call of the client's (a Responses approval request) links by its id
                asked = [call["id"] for call in event.client_calls
                         if api.handed(call) is None and isinstance(call.get("id"), str)]
                await remember(state, caller, [call_id for call_id, _ in handed] + asked, response_id)
                if handed and keep_handed:
                    await client_results.keep_handed(state, caller, handed)
            yield event
