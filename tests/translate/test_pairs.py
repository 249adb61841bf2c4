"""Across the APIs (gateway.translate.pairs): a conversation sent to the other API and back keeps
what both can say; an answer translated whole and the same answer translated as a stream, its
pieces cut anywhere, become the same message for the client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.translate.chat import CHAT
from gateway.translate.messages import MESSAGES
from gateway.translate.neutral import (
    Answer,
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Request,
    Started,
    Text,
    TextDelta,
    ToolCall,
    Turn,
)
from gateway.translate.pairs import Translation
from tests.translate.messages_cases import assembled, over_the_wire, read_stream
from tests.translate.test_chat_roundtrip import answers, requests


def _both_can_say(request: Request) -> Request:
    """A Chat-expressible request with the length limit Anthropic requires."""
    return dataclasses.replace(request, max_tokens=request.max_tokens or 4096)


def _as_messages_reads_it(body: dict[str, Any]) -> Request:
    """The request as Anthropic's side reads it, each assistant turn's text before its calls: a
    Chat message says its content before its tool calls, whatever order the model gave them."""
    read = MESSAGES.read_request(over_the_wire(body))
    turns = tuple(Turn(t.role, (*[p for p in t.parts if not isinstance(p, ToolCall)],
                                *[p for p in t.parts if isinstance(p, ToolCall)])) for t in read.turns)
    return dataclasses.replace(read, turns=turns, dropped=(), stream_usage=False)


@settings(max_examples=200, deadline=None)
@given(request=requests())
def test_a_conversation_sent_to_chat_and_back_is_the_same(request: Request) -> None:
    sent, _ = MESSAGES.write_request(_both_can_say(request))  # a Messages client's request
    assume(sent["messages"])  # a conversation of empty texts only is nothing Anthropic takes
    there, _ = Translation("messages", "chat").request(over_the_wire(sent))
    back, _ = Translation("chat", "messages").request(over_the_wire(there))
    assert _as_messages_reads_it(back) == _as_messages_reads_it(sent)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def _replayed(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk


async def _streamed_through(pair: Translation, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event async for event in pair.events(_replayed(chunks))]


def _chat_chunks(answer: Answer, cut: int) -> list[dict[str, Any]]:
    """The answer as a Chat server streams it, each text and argument cut every `cut` characters."""
    writing = CHAT.stream_writing()
    events: list[Any] = [Started(answer.answer_id, answer.model)]
    for index, part in enumerate(p for p in answer.parts if isinstance(p, Text | ToolCall)):
        whole = part.text if isinstance(part, Text) else part.arguments
        started = Text("") if isinstance(part, Text) else dataclasses.replace(part, arguments="")
        events.append(PartStarted(index, started))
        pieces = [whole[i:i + cut] for i in range(0, len(whole), cut)]
        events += [TextDelta(index, p) if isinstance(part, Text) else ArgumentsDelta(index, p) for p in pieces]
        events.append(PartEnded(index))
    events.append(Finished(answer.stop, answer.usage, answer.stop_sequence))
    return [chunk for event in events for chunk in writing.write(event)]


@settings(max_examples=200, deadline=None)
@given(answer=answers(), cut=st.integers(1, 7))
def test_a_chat_answer_whole_and_streamed_is_one_message_for_a_messages_client(answer: Answer, cut: int) -> None:
    # Arguments that are not a JSON object cannot be an Anthropic tool_use's input: whole, they are
    # written as {}, streamed they go as the model sent them (the client's check sees them first).
    answer = dataclasses.replace(answer, parts=tuple(p for p in answer.parts if isinstance(p, Text) or (
        isinstance(p, ToolCall) and _is_object(p.arguments))))
    pair = Translation("messages", "chat")
    whole = MESSAGES.read_answer(over_the_wire(pair.answer(over_the_wire(CHAT.write_answer(answer)))))
    events = asyncio.run(_streamed_through(pair, over_the_wire(_chat_chunks(answer, cut))))
    reading = MESSAGES.stream_reading()
    streamed = assembled(read_stream(reading, over_the_wire(events)))
    assert streamed.parts == whole.parts
    assert (streamed.stop, streamed.stop_sequence) == (whole.stop, whole.stop_sequence)
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (whole.usage.input_tokens,
                                                                           whole.usage.output_tokens)


def test_turns_in_the_other_api_keep_their_order() -> None:
    request = Request("m", ("be brief",), (
        Turn("user", (Text("add 2 and 3, and look up Paris"),)),
        Turn("assistant", (Text("On it."), ToolCall("toolu_1", "add", '{"a":2,"b":3}'),
                           ToolCall("toolu_2", "lookup", '{"city":"Paris"}'))),
    ), max_tokens=100)
    sent, _ = MESSAGES.write_request(request)
    there, _ = Translation("messages", "chat").request(over_the_wire(sent))
    assert [m["role"] for m in there["messages"]] == ["system", "user", "assistant"]
    assert [c["id"] for c in there["messages"][2]["tool_calls"]] == ["toolu_1", "toolu_2"]
