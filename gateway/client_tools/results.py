"""The execute step of the client's own tools, seen from the gateway: an answer that hands the
client calls of its own tools keeps, for each, when it was handed over and of which tool (the state
store's "sent" entries); a later request that brings a call's result (a Chat `tool` message, a
Responses `function_call_output`, a Messages `tool_result` block: each API's adapter finds them)
takes that entry and reports the result: the time in between (the client's tool time plus its own
overhead, the next request's trip included), the result's size, and whether it failed: as the
Messages API's `is_error` says, else only where the operator's rule says so
(`client_tool_error_prefix`; Chat and Responses flag nothing), and what the guardrails decided of
it (gateway.guardrails.client). Best effort, as trajectory links are: a state store that cannot
answer loses the step, never the request."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.caller import Caller
from gateway.errors import Unavailable
from gateway.guardrails.client import UNKNOWN_TOOL, GuardedResult
from gateway.state import StateStore, split_call_id
from gateway.tools.hooks import ClientResult, ToolHooks

log = logging.getLogger("toolspan")

# The most results of a conversation's last turn that are looked up (the conversation resends every
# earlier one, whose entries are already taken).
LATEST_RESULTS = 16


async def keep_handed(state: StateStore, caller: Caller, handed: Iterable[tuple[str, str]]) -> None:
    """Remember the client calls an answer is about to hand over ((call id, tool) each, as the
    client gets them), for their results to find."""
    now = time.time()
    records = {call_id: json.dumps([now, tool]) for call_id, tool in handed}
    if not records:
        return
    try:
        await state.sent.put(caller.principal, records)
    except Unavailable:
        log.info("client calls not kept (state store): their results will not be reported")


def _size(content: Any) -> int:
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def _failed(content: Any, error_prefix: str | None) -> bool:
    """Whether the operator's rule calls this result a failure: it starts with `error_prefix`."""
    return bool(error_prefix) and isinstance(content, str) and content.startswith(str(error_prefix))


async def report_results(state: StateStore, hooks: ToolHooks, caller: Caller,
                         results: Sequence[tuple[str, Any, bool | None]], error_prefix: str | None,
                         guarded: Mapping[str, GuardedResult] | None = None, look_up: bool = True) -> None:
    """Report each result whose call an earlier answer handed over (each once: the entry is taken):
    (call id, content, is_error) each, is_error None where the API has no such flag. `guarded`:
    what the guardrails decided of the results, by call id, carried on each report; a result the
    guardrails decided on whose call is not known here (not handed over by this gateway, its entry
    lost, or not looked up: `look_up` False) is reported too, with no time, for its decisions."""
    if not results:
        return
    taken: Mapping[str, str] = {}
    if look_up:
        try:
            taken = await state.sent.take(caller.principal, [call_id for call_id, _, _ in results])
        except Unavailable:
            log.info("client calls not looked up (state store): their results are not reported")
            if not guarded:
                return
    turn = caller.turn(0)
    for call_id, content, is_error in reversed(results):  # in the conversation's order
        decided = guarded.get(call_id) if guarded else None
        sent_at, tool = _sent(taken.get(call_id))
        if sent_at is None and (decided is None or not decided.records):
            continue  # neither handed over here nor guarded: nothing to report
        held = split_call_id(call_id)  # a call of a held turn travels under an id of the gateway's
        hooks.client_result(ClientResult(
            held[1] if held else call_id, tool or (decided.tool if decided else None) or UNKNOWN_TOOL, sent_at,
            _size(content), _failed(content, error_prefix) if is_error is None else is_error,
            decided.records if decided else (), decided.hidden if decided else ()), turn)


def _sent(record: str | None) -> tuple[float | None, str | None]:
    """(when, tool) of a call's "sent" entry; (None, None) without one, or one of another version."""
    try:
        sent_at, tool = json.loads(record) if record is not None else (None, None)
    except (ValueError, TypeError):  # a record of another version: not this one's to read
        return None, None
    if isinstance(sent_at, int | float) and isinstance(tool, str):
        return float(sent_at), tool
    return None, None
