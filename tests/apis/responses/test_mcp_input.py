"""A Responses input's mcp items read into what goes upstream (gateway.apis.responses.mcp_input):
list items dropped, copies giving way to their held turn, approval responses made decisions, and
what is left of them once the turn is no longer held."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.responses.history import restore_items
from gateway.apis.responses.mcp_input import (
    EDITED,
    approval_tokens,
    listed_labels,
    lost_calls,
    read_mcp_input,
    resumed_calls,
)
from gateway.client_tools.results import LATEST_RESULTS
from gateway.errors import BadRequest
from gateway.mcp.declared import McpOffer
from gateway.state import HeldTurn, approval_id, split_approval_id

DIGEST = "ab" * 32
OFFER = McpOffer(frozenset({"files__read_file"}), {"files__read_file": ("docs", "read_file")},
                 frozenset({"files__read_file"}))
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "files__read_file",
        "arguments": '{"path": "a"}'}
HELD = HeldTurn("responses", (CALL,), (), ())
ASKED = approval_id("tok", "call_1", DIGEST)
USER = {"role": "user", "content": "read a"}
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "docs", "tools": []}
REQUEST = {"type": "mcp_approval_request", "id": ASKED, "server_label": "docs", "name": "read_file",
           "arguments": '{"path": "a"}'}


def _approval(approve: bool = True, named: str = ASKED, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp_approval_response", "approval_request_id": named, "approve": approve, **extra}


def _take(token: str) -> HeldTurn | None:
    return HELD if token == "tok" else None


def _owner(item_id: str) -> str | None:
    return None


def test_the_whole_input_puts_the_held_call_back_and_decides_it() -> None:
    read = read_mcp_input([USER, LISTED, REQUEST, _approval(reason="fine")], _take, OFFER)
    restored = restore_items(read.items, _take, _owner)
    assert restored == [USER, CALL]  # the list dropped, the copy replaced by the held call
    decision = read.decided["call_1"]
    assert (decision.approve, decision.token, decision.reason, decision.copy_digest) == (True, "tok", "fine", None)
    assert decision.approves(DIGEST)
    assert not decision.approves("cd" * 32)
    kept, resumed = resumed_calls(restored, read.decided, _take)
    assert (kept, resumed) == ([USER], [CALL])
    assert not read.lost


def test_an_edited_copy_approves_nothing() -> None:
    edited = {**REQUEST, "arguments": '{"path": "/etc/shadow"}'}
    read = read_mcp_input([USER, edited, _approval()], _take, OFFER)
    decision = read.decided["call_1"]
    assert decision.copy_digest == EDITED
    assert not decision.approves(DIGEST)


def test_by_previous_response_id_the_response_alone_names_the_held_call() -> None:
    read = read_mcp_input([_approval(False)], _take, OFFER)
    assert restore_items(read.items, _take, _owner) == [CALL]
    assert not read.decided["call_1"].approve


@pytest.mark.parametrize("named", [approval_id("gone", "call_1", DIGEST), "mcpr_forged", "not an id"])
def test_an_approval_of_a_turn_not_held_runs_nothing_and_is_told(named: str) -> None:
    read = read_mcp_input([USER, {**REQUEST, "id": named}, _approval(named=named)], _take, OFFER)
    assert read.decided == {}
    assert read.lost
    assert read.items[0] == USER
    [told] = read.items[1:]  # the request copy dropped, the response told
    assert "could not be applied" in told["content"][0]["text"]


def test_a_ran_call_no_longer_held_becomes_a_call_and_its_output() -> None:
    ran = {"type": "mcp_call", "id": "mcp_call_9", "server_label": "docs", "name": "read_file",
           "arguments": '{"path": "b"}', "output": "bee", "status": "completed"}
    assert lost_calls([USER, ran], OFFER) == [
        USER, {"type": "function_call", "call_id": "mcp_call_9", "name": "files__read_file",
               "arguments": '{"path": "b"}'},
        {"type": "function_call_output", "call_id": "mcp_call_9", "output": "bee"}]
    other = {**ran, "server_label": "elsewhere"}
    [_, told] = lost_calls([USER, other], OFFER)
    assert told["role"] == "user"
    assert "elsewhere.read_file" in told["content"][0]["text"]


def test_listed_labels_and_the_bound_on_approvals() -> None:
    assert listed_labels([USER, LISTED]) == frozenset({"docs"})
    assert approval_tokens([REQUEST, _approval()]) == ["tok", "tok"]
    with pytest.raises(BadRequest) as refused:
        approval_tokens([_approval()] * (LATEST_RESULTS + 1))
    assert refused.value.code == "too_many_approvals"


@given(st.text(alphabet="abcdefghij_-0123456789", min_size=1, max_size=40),
       st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_approval_ids_name_their_turn_call_and_digest(call_id: str, digest: str) -> None:
    assert split_approval_id(approval_id("tok", call_id, digest)) == ("tok", call_id, digest[:32])
