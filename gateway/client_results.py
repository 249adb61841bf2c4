"""The execute step of the client's own tools, seen from the gateway: an answer that hands the
client calls of its own tools keeps, for each, when it was handed over and of which tool (the state
store's "sent" entries); a later request that brings a call's result (a Chat `tool` message, a
Responses `function_call_output`) takes that entry and reports the result: the time in between
(the client's tool time plus its own overhead, the next request's trip included), the result's
size, and an error only where the operator's rule says so (`client_tool_error_prefix`; neither API
flags one). Best effort, as trajectory links are: a state store that cannot answer loses the step,
never the request."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

from gateway.caller import Caller
from gateway.errors import Unavailable
from gateway.state import StateStore, split_call_id
from gateway.tools.hooks import ClientResult, ToolHooks

log = logging.getLogger("toolspan")

# The latest results of a conversation that are looked up: those of the answer before are at its
# end, and the conversation resends every earlier one, whose entries are already taken.
LATEST_RESULTS = 16
_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # Responses items that carry a call's result


def _handed(api: str, call: Mapping[str, Any]) -> tuple[str, str] | None:
    """(call id, tool) of a call as the client got it."""
    if api == "chat":
        function = call.get("function") if call.get("type", "function") == "function" else call.get("custom")
        call_id, name = call.get("id"), function.get("name") if isinstance(function, Mapping) else None
    else:
        call_id, name = call.get("call_id"), call.get("name")
    return (call_id, name) if isinstance(call_id, str) and isinstance(name, str) else None


async def keep_handed(state: StateStore, caller: Caller, api: str, client_calls: Iterable[Mapping[str, Any]]) -> None:
    """Remember the client calls an answer is about to hand over, for their results to find."""
    now = time.time()
    records = {call_id: json.dumps([now, tool]) for call in client_calls if (found := _handed(api, call))
               for call_id, tool in (found,)}
    if not records:
        return
    try:
        await state.keep_sent(caller.principal, records)
    except Unavailable:
        log.info("client calls not kept (state store): their results will not be reported")


def chat_results(messages: Sequence[Any]) -> list[tuple[str, Any]]:
    """(call id, content) of the latest `tool` messages of a Chat conversation."""
    found = ((m["tool_call_id"], m.get("content")) for m in reversed(messages)
             if isinstance(m, Mapping) and m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str))
    return list(islice(found, LATEST_RESULTS))


def responses_results(items: object) -> list[tuple[str, Any]]:
    """(call id, output) of the latest call outputs of a Responses input."""
    if not isinstance(items, list):
        return []
    found = ((i["call_id"], i.get("output")) for i in reversed(items)
             if isinstance(i, Mapping) and i.get("type") in _OUTPUTS and isinstance(i.get("call_id"), str))
    return list(islice(found, LATEST_RESULTS))


def _size(content: Any) -> int:
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def _failed(content: Any, error_prefix: str | None) -> bool:
    """Whether the operator's rule calls this result a failure: it starts with `error_prefix`."""
    return bool(error_prefix) and isinstance(content, str) and content.startswith(str(error_prefix))


async def report_results(state: StateStore, hooks: ToolHooks, caller: Caller, results: Sequence[tuple[str, Any]],
                         error_prefix: str | None) -> None:
    """Report each result whose call an earlier answer handed over (each once: the entry is taken)."""
    if not results:
        return
    try:
        taken = await state.taken_sent(caller.principal, [call_id for call_id, _ in results])
    except Unavailable:
        log.info("client calls not looked up (state store): their results are not reported")
        return
    turn = caller.turn(0)
    for call_id, content in reversed(results):  # in the conversation's order
        record = taken.get(call_id)
        try:
            sent_at, tool = json.loads(record) if record is not None else (None, None)
        except (ValueError, TypeError):  # a record of another version: not this one's to read
            continue
        if isinstance(sent_at, int | float) and isinstance(tool, str):
            held = split_call_id(call_id)  # a call of a held turn travels under an id of the gateway's
            hooks.client_result(ClientResult(held[1] if held else call_id, tool, float(sent_at), _size(content),
                                             _failed(content, error_prefix)), turn)
