"""The client's execute step (gateway.client_tools.results) on bad input: conversations of any shape
give only well-formed results, those of the last turn, the latest ones first and bounded; a record
this version cannot read reports nothing and raises nothing; each result is reported once; a
result the guardrails decided on is reported with their decisions, known to the state store or not."""

from __future__ import annotations

import json
from typing import Any

from gateway.apis.chat import CHAT
from gateway.apis.chat.request import results as chat_results
from gateway.apis.messages.request import results as messages_results
from gateway.apis.responses.request import results as responses_results
from gateway.caller import Caller
from gateway.client_tools.results import LATEST_RESULTS, keep_handed, report_results
from gateway.guardrails import GuardrailRecord
from gateway.guardrails.client import GuardedResult
from gateway.state import MemoryState
from gateway.tools.hooks import ClientResult, NoHooks, Turn


class Seen(NoHooks):
    """The results reported, as the telemetry would get them."""

    def __init__(self) -> None:
        self.results: list[ClientResult] = []

    def client_result(self, result: ClientResult, turn: Turn) -> None:
        self.results.append(result)


CALLER = Caller("traj-1", "req-1")


def test_only_well_formed_results_are_read_latest_first_and_bounded() -> None:
    messages: list[Any] = ["text", None, {"role": "tool"}, {"role": "tool", "tool_call_id": 7, "content": "x"},
                           {"role": "user", "tool_call_id": "u"}]
    messages += [{"role": "tool", "tool_call_id": f"call_{i}", "content": str(i)} for i in range(40)]
    found = chat_results(messages)
    assert len(found) == LATEST_RESULTS
    assert found[0] == ("call_39", "39", None)
    assert responses_results("plain text") == []
    items = [{"type": "function_call_output", "call_id": 3}, {"type": "message", "call_id": "m"},
             {"type": "custom_tool_call_output", "call_id": "c", "output": "done"}]
    assert responses_results(items) == [("c", "done", None)]


async def test_a_result_is_reported_once_and_an_unreadable_record_not_at_all() -> None:
    state, seen = MemoryState(100, 60.0), Seen()
    calls = [{"id": "call_a", "type": "function", "function": {"name": "shell"}},
             {"id": 5, "function": {"name": "bad"}}, {"type": "function"}]
    await keep_handed(state, CALLER, [found for call in calls if (found := CHAT.handed(call)) is not None])
    await state.sent.put(None, {"call_b": "[not json", "call_c": json.dumps({"a": 1})})
    results = [("call_a", "ok", None), ("call_b", "x", None), ("call_c", [{"type": "text", "text": "hé"}], None)]
    await report_results(state, seen, CALLER, results, error_prefix=None)
    assert [(r.call_id, r.tool, r.size, r.error) for r in seen.results] == [("call_a", "shell", 2, False)]
    await report_results(state, seen, CALLER, results, error_prefix=None)
    assert len(seen.results) == 1  # taken: the conversation sending it again reports nothing more


async def test_the_error_rule_reads_text_results_only() -> None:
    state, seen = MemoryState(100, 60.0), Seen()
    await keep_handed(state, CALLER, [("c1", "shell"), ("c2", "shell")])
    latest_first = [("c2", {"error": "as JSON"}, None), ("c1", "error: gone", None)]  # as chat_results gives them
    await report_results(state, seen, CALLER, latest_first, error_prefix="error:")
    assert [(r.call_id, r.error) for r in seen.results] == [("c1", True), ("c2", False)]


MASKED_BY = (GuardrailRecord("credentials", "after", "mask", "a live key masked", side="client"),)


async def test_a_guarded_result_is_reported_with_its_decisions_whether_or_not_its_call_is_known() -> None:
    state, seen = MemoryState(100, 60.0), Seen()
    await keep_handed(state, CALLER, [("call_known", "shell")])
    guarded = {"call_known": GuardedResult("shell_in_body", MASKED_BY, ("sk-live-1",)),
               "call_foreign": GuardedResult("read_env", MASKED_BY, ("sk-live-2",)),
               "call_nameless": GuardedResult(None, MASKED_BY, ()),
               "call_allowed": GuardedResult("t", (), ())}  # no decision: nothing to report
    results = [("call_allowed", "x", None), ("call_nameless", "y", None), ("call_foreign", "[REDACTED]", None),
               ("call_known", "ok", None)]
    await report_results(state, seen, CALLER, results, None, guarded)
    assert [(r.call_id, r.tool, r.sent_at is None, r.guardrails, r.hidden) for r in seen.results] == [
        ("call_known", "shell", False, MASKED_BY, ("sk-live-1",)),  # the tool as the gateway handed it over
        ("call_foreign", "read_env", True, MASKED_BY, ("sk-live-2",)),  # not handed over here: the body's tool
        ("call_nameless", "unknown", True, MASKED_BY, ())]


async def test_with_the_check_off_the_guarded_results_are_reported_without_a_look_up() -> None:
    state, seen = MemoryState(100, 60.0), Seen()
    await keep_handed(state, CALLER, [("call_known", "shell")])
    guarded = {"call_known": GuardedResult("shell", MASKED_BY, ())}
    await report_results(state, seen, CALLER, [("call_known", "ok", None)], None, guarded, look_up=False)
    [result] = seen.results
    assert result.sent_at is None
    assert result.guardrails == MASKED_BY
    assert await state.sent.take(None, ["call_known"]) != {}  # its entry left for a request that looks


def test_the_latest_results_are_those_of_the_last_turn() -> None:
    messages: list[Any] = [{"role": "assistant", "tool_calls": []},
                           {"role": "tool", "tool_call_id": "old", "content": "1"},
                           {"role": "assistant", "tool_calls": []},
                           {"role": "tool", "tool_call_id": "new", "content": "2"},
                           {"role": "user", "content": "and then?"}]
    assert chat_results(messages) == [("new", "2", None)]
    items = [{"type": "function_call", "call_id": "old"}, {"type": "function_call_output", "call_id": "old"},
             {"type": "message", "role": "assistant", "content": []},
             {"type": "function_call", "call_id": "a"}, {"type": "function_call_output", "call_id": "a", "output": 1},
             {"type": "function_call", "call_id": "b"}, {"type": "function_call_output", "call_id": "b", "output": 2},
             {"role": "user", "content": "go on"}]
    assert responses_results(items) == [("b", 2, None), ("a", 1, None)]  # interleaved calls and outputs: one turn
    blocks = [{"role": "assistant", "content": [{"type": "tool_use", "id": "old"}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "old"}]},
              {"role": "assistant", "content": [{"type": "tool_use", "id": "a"}, {"type": "tool_use", "id": "b"}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"},
                                           {"type": "tool_result", "tool_use_id": "b", "is_error": True}]}]
    assert messages_results(blocks) == [("b", None, True), ("a", "x", False)]
