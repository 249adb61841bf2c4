"""The results of the client's tools in a request's body, through each API's adapter and the
guardrails on them (gateway.guardrails.client): every result the client resends is masked every
time, not only the newest; the latest turn's are the ones reported; a text seen before costs no
chain run; each mode applies what it says; no shape of content raises, and what cannot be read is
left as it was."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.apis.base import WireApi
from gateway.apis.chat import CHAT
from gateway.apis.messages import MESSAGES
from gateway.apis.responses import RESPONSES
from gateway.guardrails import Chains, GuardedCall, Guardrail, Guardrails, Verdict
from gateway.guardrails.client import ClientResultMode, ClientResults, ResultVerdicts
from tests.client_tools.guards import EXAMPLE_KEY as KEY
from tests.client_tools.guards import MASKED, QUARANTINED, Credentials, Quarantine

Call = tuple[str, str, dict[str, Any], Any]  # (call id, tool, arguments, the result's content)


@dataclass(frozen=True)
class Shape:
    """One API's conversations with the client's tools: a body of turns, and a result read back."""

    api: WireApi
    text_type: str
    body: Callable[[list[list[Call]]], dict[str, Any]]
    content: Callable[[dict[str, Any], str], Any]


def chat_body(turns: list[list[Call]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in turns:
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
            for cid, tool, args, _ in turn]})
        messages += [{"role": "tool", "tool_call_id": cid, "content": content} for cid, _, _, content in turn]
    return {"model": "m", "messages": messages}


def chat_content(body: dict[str, Any], call_id: str) -> Any:
    [found] = [m["content"] for m in body["messages"] if m.get("tool_call_id") == call_id]
    return found


def responses_body(turns: list[list[Call]]) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in turns:
        items.append({"type": "reasoning", "id": f"rs_{turn[0][0]}", "summary": []})
        items += [{"type": "function_call", "call_id": cid, "name": tool, "arguments": json.dumps(args)}
                  for cid, tool, args, _ in turn]
        items += [{"type": "function_call_output", "call_id": cid, "output": content} for cid, _, _, content in turn]
    return {"model": "m", "input": items}


def responses_content(body: dict[str, Any], call_id: str) -> Any:
    [found] = [i["output"] for i in body["input"] if i.get("type") == "function_call_output"
               and i.get("call_id") == call_id]
    return found


def messages_body(turns: list[list[Call]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in turns:
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": cid, "name": tool, "input": args} for cid, tool, args, _ in turn]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": cid, "content": content, "is_error": cid.endswith("err")}
            for cid, _, _, content in turn]})
    return {"model": "m", "max_tokens": 100, "messages": messages}


def messages_block(body: dict[str, Any], call_id: str) -> dict[str, Any]:
    [found] = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("tool_use_id") == call_id]
    assert isinstance(found, dict)
    return found


def messages_content(body: dict[str, Any], call_id: str) -> Any:
    return messages_block(body, call_id)["content"]


SHAPES = {"chat": Shape(CHAT, "text", chat_body, chat_content),
          "responses": Shape(RESPONSES, "input_text", responses_body, responses_content),
          "messages": Shape(MESSAGES, "text", messages_body, messages_content)}
BY_API = pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))


def guards(mode: ClientResultMode = "mask", *chain: object) -> tuple[ClientResults, Credentials]:
    credentials = Credentials()
    guardrails = Guardrails(Chains(timeout=5.0), gateway=chain or (credentials,))
    return ClientResults(guardrails, mode), credentials


def two_turns(shape: Shape) -> dict[str, Any]:
    """An earlier turn whose result carries a key, and the latest turn with a key in a list of parts."""
    return shape.body([
        [("call_old", "read_env", {"name": "prod"}, f"KEY={KEY}")],
        [("call_new", "read_file", {"path": ".env"}, [{"type": shape.text_type, "text": f"token {KEY}"}]),
         ("call_clean", "read_file", {"path": "README"}, "nothing secret")]])


@BY_API
async def test_every_result_is_masked_and_the_latest_turn_is_the_one_reported(shape: Shape) -> None:
    results, credentials = guards()
    body = two_turns(shape)
    asked = shape.api.checked(body, {})
    assert [call_id for call_id, _, _ in asked.results] == ["call_clean", "call_new"]  # the last turn, latest first
    guarded = await results.guard(shape.api.result_places(body), "key-a", "traj-1")
    assert shape.content(body, "call_old") == f"KEY={MASKED}"  # resent from an earlier turn: masked too
    assert shape.content(body, "call_new") == [{"type": shape.text_type, "text": f"token {MASKED}"}]
    assert shape.content(body, "call_clean") == "nothing secret"
    assert set(guarded) == {"call_old", "call_new", "call_clean"}
    new = guarded["call_new"]
    assert new.tool == "read_file"  # from the assistant turn's call in the body
    assert [(r.guardrail, r.moment, r.decision, r.side) for r in new.records] == [
        ("credentials", "after", "mask", "client")]
    assert new.hidden == (KEY,)
    assert [r.decision for r in guarded["call_clean"].records] == ["allow"]
    seen = {call.call_id: call for call in credentials.calls}
    assert seen["call_new"].arguments == {"path": ".env"}  # the call's arguments, decoded
    assert (seen["call_new"].principal, seen["call_new"].trajectory_id, seen["call_new"].side) == (
        "key-a", "traj-1", "client")
    assert asked.results[1][1] == [{"type": shape.text_type, "text": f"token {KEY}"}]  # the size is of what came


@BY_API
async def test_a_text_seen_before_is_masked_again_without_running_the_chain(shape: Shape) -> None:
    results, credentials = guards()
    await results.guard(shape.api.result_places(two_turns(shape)), "key-a")
    assert len(credentials.seen) == 3
    again = two_turns(shape)  # the client resends the conversation as it had it: unmasked
    guarded = await results.guard(shape.api.result_places(again), "key-a")
    assert len(credentials.seen) == 3  # no chain run: the decisions were kept
    assert results.verdicts.hits == 3
    assert shape.content(again, "call_old") == f"KEY={MASKED}"
    assert guarded["call_new"].hidden == (KEY,)
    await results.guard(shape.api.result_places(two_turns(shape)), "key-b")
    assert len(credentials.seen) == 6  # another key's chain may differ: its own decisions


async def test_the_kept_decisions_are_bounded_in_entries_and_characters() -> None:
    results, credentials = guards()
    verdicts = results.verdicts = ResultVerdicts(size=2, max_chars=300)
    await results.guard(CHAT.result_places(chat_body([[(f"c{i}", "t", {}, f"text {i} {KEY}") for i in range(3)]])),
                        None)
    assert len(verdicts) == 2
    assert verdicts.chars <= 300
    await results.guard(CHAT.result_places(chat_body([[("mid", "t", {}, f"{'x' * 200} {KEY}")]])), None)
    assert len(verdicts) == 1
    assert verdicts.chars <= 300
    huge = chat_body([[("huge", "t", {}, f"{'x' * 400} {KEY}")]])
    for _ in range(2):  # past the bound alone: never kept, checked each time
        await results.guard(CHAT.result_places(copy.deepcopy(huge)), None)
    assert len(verdicts) == 1
    assert len(credentials.seen) == 6


@BY_API
async def test_observe_records_and_changes_nothing(shape: Shape) -> None:
    results, _ = guards("observe")
    body = two_turns(shape)
    before = copy.deepcopy(body)
    guarded = await results.guard(shape.api.result_places(body), None)
    assert body == before
    assert [r.decision for r in guarded["call_old"].records] == ["mask"]


@BY_API
async def test_mask_mode_records_a_block_and_still_masks_after_it(shape: Shape) -> None:
    results, _ = guards("mask", Quarantine(), Credentials())
    body = shape.body([[("call_q", "fetch", {}, f"{QUARANTINED} {KEY}")]])
    guarded = await results.guard(shape.api.result_places(body), None)
    assert shape.content(body, "call_q") == f"{QUARANTINED} {MASKED}"
    assert [(r.guardrail, r.decision) for r in guarded["call_q"].records] == [
        ("quarantine", "block"), ("credentials", "mask")]


@BY_API
async def test_block_mode_replaces_a_blocked_result_with_the_chains_message(shape: Shape) -> None:
    results, _ = guards("block", Credentials(), Quarantine())
    body = shape.body([[("call_q", "fetch", {}, [{"type": shape.text_type, "text": f"{QUARANTINED} {KEY}"},
                                                 {"type": "image", "source": {"data": "x"}}]),
                        ("call_k", "fetch", {}, f"only {KEY}")]])
    guarded = await results.guard(shape.api.result_places(body), None)
    [part] = shape.content(body, "call_q")  # withheld whole: no part of it reaches the provider
    assert part["type"] == shape.text_type
    assert "withheld by guardrail 'quarantine'" in part["text"]
    assert "The result is quarantined." in part["text"]
    assert shape.content(body, "call_k") == f"only {MASKED}"
    assert [(r.guardrail, r.decision) for r in guarded["call_q"].records] == [
        ("credentials", "mask"), ("quarantine", "block")]
    assert guarded["call_q"].hidden == (KEY,)


async def test_messages_keeps_is_error_and_the_other_fields_of_a_masked_part() -> None:
    results, _ = guards()
    body = messages_body([[("call_err", "run", {}, [{"type": "text", "text": f"failed: {KEY}",
                                                     "cache_control": {"type": "ephemeral"}}])]])
    await results.guard(MESSAGES.result_places(body), None)
    block = messages_block(body, "call_err")
    assert block["is_error"] is True
    assert block["content"] == [{"type": "text", "text": f"failed: {MASKED}", "cache_control": {"type": "ephemeral"}}]


@BY_API
async def test_no_shape_of_content_raises_and_what_cannot_be_read_stays(shape: Shape) -> None:
    results, credentials = guards()
    odd: list[Any] = [{"key": KEY}, 7, None, [KEY, None, {"type": shape.text_type, "text": 5}],
                      [{"type": "image", "source": {"data": KEY}}], []]
    huge = "x" * (2 * 1024 * 1024) + KEY
    turn: list[Call] = [(f"odd_{i}", "t", {}, content) for i, content in enumerate(odd)]
    body = shape.body([[*turn, ("huge", "t", {}, huge)]])
    before = copy.deepcopy(body)
    guarded = await results.guard(shape.api.result_places(body), None)
    for i in range(len(odd)):
        assert shape.content(body, f"odd_{i}") == shape.content(before, f"odd_{i}")  # unreadable: as it came
    assert set(guarded) == {"huge"}
    assert shape.content(body, "huge").endswith(MASKED)
    assert len(credentials.seen) == 1


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": ["text", None, {"role": "tool", "tool_call_id": 3, "content": KEY},
                                {"role": "assistant", "tool_calls": [None, {"id": 5}, {"id": "c", "function": 1}]},
                                {"role": "tool", "content": KEY}]},
    {"model": "m", "input": "plain"},
    {"model": "m", "input": [{"type": "function_call_output", "output": KEY}, {"type": "function_call", "call_id": 1}]},
    {"model": "m", "messages": [{"role": "user", "content": [None, {"type": "tool_result", "tool_use_id": 2}]}]},
], ids=["chat", "responses-text", "responses", "messages"])
async def test_bodies_without_a_readable_result_raise_nothing(body: dict[str, Any]) -> None:
    results, credentials = guards()
    for api in (CHAT, RESPONSES, MESSAGES):
        assert await results.guard(api.result_places(body), None) == {}
    assert credentials.seen == []


async def test_a_result_whose_call_the_body_lacks_is_of_the_tool_it_names_else_unknown() -> None:
    results, credentials = guards()
    body = {"model": "m", "previous_response_id": "resp_1", "input": [
        {"type": "function_call_output", "call_id": "a", "output": KEY, "name": "named_tool"},
        {"type": "function_call_output", "call_id": "b", "output": KEY}]}
    guarded = await results.guard(RESPONSES.result_places(body), None)
    assert (guarded["a"].tool, guarded["b"].tool) == ("named_tool", None)
    assert [call.tool for call in credentials.calls] == ["named_tool", "unknown"]


async def test_nothing_is_spent_without_guardrails_or_with_the_mode_off() -> None:
    guardrails = Guardrails(Chains(), gateway=[Credentials()])
    assert ClientResults.configured(None, "mask") is None
    assert ClientResults.configured(guardrails, "off") is None
    only_before = ClientResults(Guardrails(Chains(), gateway=[OnlyArguments()]), "mask")
    body = chat_body([[("c", "t", {}, KEY)]])
    assert await only_before.guard(CHAT.result_places(body), None) == {}  # no guardrail looks at results
    assert chat_content(body, "c") == KEY


class OnlyArguments(Guardrail):
    name = "only_arguments"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        raise AssertionError("a result is no call")


class Broken(Guardrail):
    name = "broken"

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        raise RuntimeError("the scanner is down")


@BY_API
async def test_mask_mode_withholds_a_text_a_failed_guardrail_could_not_check(shape: Shape) -> None:
    results, _ = guards("mask", Broken())  # guardrail_failure deny (the default)
    body = shape.body([[("call_b", "fetch", {}, f"only {KEY}")]])
    guarded = await results.guard(shape.api.result_places(body), None)
    text = shape.content(body, "call_b")
    assert KEY not in json.dumps(text)
    assert "could not check it" in json.dumps(text)
    [record] = guarded["call_b"].records
    assert (record.guardrail, record.decision, record.failed) == ("broken", "block", "RuntimeError")
    results.guardrails.chains.failure = "allow"  # the operator's rule: let unchecked text through
    body = shape.body([[("call_b", "fetch", {}, f"only {KEY}")]])
    await results.guard(shape.api.result_places(body), None)
    assert shape.content(body, "call_b") == f"only {KEY}"
