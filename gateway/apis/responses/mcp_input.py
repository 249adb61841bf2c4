"""A Responses input's items of the `mcp` tools the gateway runs (gateway.mcp.declared), made into
what goes upstream: `mcp_list_tools` items only tell the gateway not to list a server again; copies
of `mcp_call` and `mcp_approval_request` items give way to the held turn they came from (or, once it
is no longer held, to what the model can still read of them); each `mcp_approval_response` becomes
the client's decision on its held call (tools.approvals.ClientDecision).

An approval request's id names its held turn, call and arguments (state.approval_id): a response to
an id the gateway did not make, or for a turn this key does not hold, approves nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.client_tools.results import LATEST_RESULTS
from gateway.engine.history import Take
from gateway.errors import BadRequest
from gateway.mcp.declared import McpOffer
from gateway.state import client_call_id, split_approval_id
from gateway.tools.approvals import ClientDecision

LISTS = "mcp_list_tools"
CALL = "mcp_call"
REQUEST = "mcp_approval_request"
RESPONSE = "mcp_approval_response"
MCP_ITEMS = frozenset({LISTS, CALL, REQUEST, RESPONSE})
EDITED = "edited"  # the copy_digest of a resent request whose name or arguments differ from the held call's


def has_mcp_items(items: Sequence[Any]) -> bool:
    return any(isinstance(item, Mapping) and item.get("type") in MCP_ITEMS for item in items)


def listed_labels(items: Sequence[Any]) -> frozenset[str]:
    """The servers whose tool lists the input already carries (not listed again)."""
    return frozenset(str(item.get("server_label")) for item in items
                     if isinstance(item, Mapping) and item.get("type") == LISTS)


def approval_tokens(items: Sequence[Any]) -> list[str]:
    """The held turns the input's approval requests and responses name; a 400 past the bound."""
    tokens: list[str] = []
    responses = 0
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        responses += kind == RESPONSE
        named = item.get("approval_request_id") if kind == RESPONSE else item.get("id") if kind == REQUEST else None
        if (parts := split_approval_id(named)) is not None:
            tokens.append(parts[0])
    if responses > LATEST_RESULTS:
        raise BadRequest(f"at most {LATEST_RESULTS} mcp_approval_response items in one request", param="input",
                         code="too_many_approvals")
    return tokens


@dataclass
class McpInput:
    """The input once its mcp items are read: the items, the client's decisions by call id, and
    whether an approval named a turn the gateway no longer holds."""

    items: list[Any]
    decided: dict[str, ClientDecision] = field(default_factory=dict)
    lost: bool = False


def _held_call(take: Take, token: str, call_id: str) -> Mapping[str, Any] | None:
    held = take(token)
    if held is None:
        return None
    return next((item for item in held.calls if item.get("type") == "function_call"
                 and item.get("call_id") == call_id), None)


def _copy_digest(copy: Mapping[str, Any] | None, held: Mapping[str, Any], offer: McpOffer) -> str | None:
    """None when the resent request shows the held call as it is; EDITED when it was changed."""
    if copy is None:
        return None
    label, remote = offer.by_name.get(str(held.get("name")), (None, None))
    same = (copy.get("name") == remote and copy.get("server_label") == label
            and _parsed(copy.get("arguments")) == _parsed(held.get("arguments")))
    return None if same else EDITED


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _told(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def _lost_call(item: Mapping[str, Any], offer: McpOffer) -> list[Any]:
    """A ran call's copy whose turn is no longer held: a call and its output when its server is
    declared now, else what the model can read of it."""
    label, remote = item.get("server_label"), item.get("name")
    name = next((n for n, shown in offer.by_name.items() if shown == (label, remote)), None)
    output = item.get("output")
    said = output if isinstance(output, str) else json.dumps(item.get("error"), ensure_ascii=False)
    if name is None:
        return [_told(f"Your earlier call of {label}.{remote} with {item.get('arguments')} returned: {said}")]
    call_id = str(item.get("id"))
    return [{"type": "function_call", "call_id": call_id, "name": name, "arguments": item.get("arguments") or "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": said}]


def read_mcp_input(items: Sequence[Any], take: Take, offer: McpOffer, continued: bool = False) -> McpInput:
    """Before the held turns are restored (history.restore_items): list items dropped, each
    approval request copy turned into a name of its held call (so the held turn takes its place),
    each approval response into a decision. `continued`: the request continues a response by
    previous_response_id."""
    copies = {str(item.get("id")): item for item in items if isinstance(item, Mapping) and item.get("type") == REQUEST}
    read = McpInput([])
    for item in items:
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == LISTS:
            continue
        if kind == REQUEST:
            parts = split_approval_id(item.get("id"))
            if parts is not None and _held_call(take, parts[0], parts[1]) is not None:
                read.items.append({"type": "function_call", "call_id": client_call_id(parts[0], parts[1])})
            continue  # a request the gateway no longer holds: nothing ran, nothing to show the model
        if kind == RESPONSE:
            _decide(item, take, offer, copies, read, continued)
            continue
        read.items.append(item)
    return read


def _decide(item: Mapping[str, Any], take: Take, offer: McpOffer, copies: Mapping[str, Mapping[str, Any]],
            read: McpInput, continued: bool) -> None:
    named = item.get("approval_request_id")
    parts = split_approval_id(named)
    held = _held_call(take, parts[0], parts[1]) if parts is not None else None
    if parts is None or held is None:
        read.lost = True
        read.items.append(_told(f"The approval {str(named)[:200]} could not be applied: the gateway no longer holds "
                                "that call, and it did not run."))
        return
    token, call_id, digest = parts
    reason = item.get("reason")
    read.decided[call_id] = ClientDecision(call_id, item.get("approve") is True, digest,
                                           reason if isinstance(reason, str) else None,
                                           _copy_digest(copies.get(str(named)), held, offer), token)
    if str(named) in copies:
        return
    turn = take(token)
    if continued and turn is not None and not turn.before:  # the provider keeps the turn: only its results go
        read.items.extend(result for result in turn.results if result not in read.items)
    else:  # the held turn comes back by this name
        read.items.append({"type": "function_call", "call_id": client_call_id(token, call_id)})


def lost_calls(items: Sequence[Any], offer: McpOffer) -> list[Any]:
    """After restoring: the mcp_call copies no held turn took back, as the model can read them."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, Mapping) and item.get("type") == CALL:
            out += _lost_call(item, offer)
        else:
            out.append(item)
    return out


def resumed_calls(items: Sequence[Any], decided: Mapping[str, ClientDecision],
                  take: Take) -> tuple[list[Any], list[Mapping[str, Any]]]:
    """The input without the held calls the client decided on, and those calls as the gateway
    holds them (never the client's copies), to run before the provider is called (gateway.engine.run)."""
    calls = [call for decision in decided.values()
             if (call := _held_call(take, decision.token, decision.call_id)) is not None]
    ids = {call.get("call_id") for call in calls}
    kept = [item for item in items if not (isinstance(item, Mapping) and item.get("type") == "function_call"
                                           and item.get("call_id") in ids)]
    return kept, calls
