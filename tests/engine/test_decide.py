"""Every decision of the tool loop, for a Chat answer and for a Responses answer alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.chat.answer import read_chat
from gateway.apis.responses.answer import read_response
from gateway.apis.tool_choice import relaxed_tool_choice
from gateway.engine.decide import Finish, HandBack, RunTools, decide, is_final
from gateway.engine.turn import ModelTurn

CLIENT = frozenset({"ask_human"})
MAX = 3


def chat_turn(calls: list[tuple[str, str]], kind: str = "function") -> ModelTurn:
    """A chat completion whose message makes these (name, id) calls."""
    tool_calls = [{"id": i, "type": kind, kind: {"name": n, ("arguments" if kind == "function" else "input"): "{}"}}
                  for n, i in calls]
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else "an answer"}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return read_chat({"id": "chatcmpl-1", "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]})


def responses_turn(calls: list[tuple[str, str]], kind: str = "function") -> ModelTurn:
    """A response whose output makes these (name, id) calls."""
    if kind == "function":
        items = [{"type": "function_call", "id": f"fc_{i}", "call_id": i, "name": n, "arguments": "{}"}
                 for n, i in calls]
    else:
        items = [{"type": "custom_tool_call", "id": f"ctc_{i}", "call_id": i, "name": n, "input": "x"}
                 for n, i in calls]
    output = items or [{"type": "message", "id": "msg_1", "role": "assistant",
                        "content": [{"type": "output_text", "text": "an answer"}]}]
    return read_response({"id": "resp_1", "status": "completed", "output": output})


API = pytest.mark.parametrize("turn_of", [chat_turn, responses_turn], ids=["chat", "responses"])


def ids(calls: tuple[Any, ...]) -> list[str]:
    return [c.id for c in calls]


@API
def test_an_answer_without_calls_finishes(turn_of: Any) -> None:
    assert decide(turn_of([]), CLIENT, 0, MAX, None, relaxed_tool_choice) == Finish("stop")


@API
def test_gateway_calls_run_and_the_loop_goes_on(turn_of: Any) -> None:
    decision = decide(turn_of([("read_file", "c1"), ("add", "c2")]), CLIENT, 0, MAX, "auto", relaxed_tool_choice)
    assert isinstance(decision, RunTools)
    assert ids(decision.calls) == ["c1", "c2"]
    assert decision.tool_choice == "auto"


@API
def test_an_invented_tool_name_is_the_gateways_to_reject(turn_of: Any) -> None:
    decision = decide(turn_of([("no_such_tool", "c1")]), CLIENT, 0, MAX, None, relaxed_tool_choice)
    assert isinstance(decision, RunTools)
    assert ids(decision.calls) == ["c1"]


@API
def test_client_calls_alone_go_back_to_the_client_unheld(turn_of: Any) -> None:
    decision = decide(turn_of([("ask_human", "c1")]), CLIENT, 0, MAX, None, relaxed_tool_choice)
    assert decision == HandBack((), decision.client_calls, hold=False)  # type: ignore[union-attr]
    assert ids(decision.client_calls) == ["c1"]  # type: ignore[union-attr]


@API
def test_client_calls_after_gateway_rounds_are_held(turn_of: Any) -> None:
    decision = decide(turn_of([("ask_human", "c1")]), CLIENT, 1, MAX, None, relaxed_tool_choice)
    assert isinstance(decision, HandBack)
    assert decision.hold


@API
def test_a_mixed_turn_runs_the_gateways_half_and_holds_it(turn_of: Any) -> None:
    decision = decide(turn_of([("read_file", "c1"), ("ask_human", "c2")]), CLIENT, 0, MAX, None, relaxed_tool_choice)
    assert isinstance(decision, HandBack)
    assert (ids(decision.gateway_calls), ids(decision.client_calls), decision.hold) == (["c1"], ["c2"], True)


@API
def test_free_form_custom_calls_are_always_the_clients(turn_of: Any) -> None:
    decision = decide(turn_of([("grammar", "c1")], kind="custom"), CLIENT, 0, MAX, None, relaxed_tool_choice)
    assert isinstance(decision, HandBack)
    assert ids(decision.client_calls) == ["c1"]
    assert decision.client_calls[0].kind == "client"


@API
def test_at_the_round_limit_gateway_calls_are_dropped_and_the_answer_stops(turn_of: Any) -> None:
    assert decide(turn_of([("read_file", "c1")]), CLIENT, MAX, MAX, None, relaxed_tool_choice) == Finish("stop")


@API
def test_at_the_round_limit_client_calls_still_go_back(turn_of: Any) -> None:
    decision = decide(turn_of([("read_file", "c1"), ("ask_human", "c2")]), CLIENT, MAX, MAX, None, relaxed_tool_choice)
    assert isinstance(decision, HandBack)
    assert (ids(decision.gateway_calls), ids(decision.client_calls), decision.hold) == ([], ["c2"], True)


@API
@pytest.mark.parametrize(("choice", "after"), [
    ("required", "auto"),
    ("auto", "auto"),
    ("none", "none"),
    ({"type": "function", "function": {"name": "read_file"}}, "auto"),  # Chat's shape
    ({"type": "function", "name": "read_file"}, "auto"),  # Responses' shape
    ({"type": "function", "name": "add"}, {"type": "function", "name": "add"}),  # not run: still forced
    ({"type": "web_search"}, {"type": "web_search"}),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "read_file"}]},
     {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "read_file"}]}),  # Responses
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}},
     {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}),  # Chat
])
def test_a_forced_tool_choice_is_relaxed_once_it_ran(turn_of: Any, choice: Any, after: Any) -> None:
    decision = decide(turn_of([("read_file", "c1")]), CLIENT, 0, MAX, choice, relaxed_tool_choice)
    assert isinstance(decision, RunTools)
    assert decision.tool_choice == after


def test_the_final_round_is_the_one_past_the_limit() -> None:
    assert [is_final(rounds, 2) for rounds in range(4)] == [False, False, True, True]
    assert relaxed_tool_choice({"type": "function", "name": "x"}, set()) == {"type": "function", "name": "x"}


@API
def test_a_turn_knows_its_calls_in_the_models_order(turn_of: Any) -> None:
    turn = turn_of([("b", "c2"), ("a", "c1")])
    assert [(c.name, c.id, json.loads(c.arguments)) for c in turn.calls] == [("b", "c2", {}), ("a", "c1", {})]
    assert turn.finish_reason == "tool_calls"
