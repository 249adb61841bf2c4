"""The Chat Completions side of translation (gateway.translate.sides.Side): its requests, answers
and streamed answers read into the neutral forms and written from them. The pieces live in
chat_request, chat_answer and chat_stream; CHAT is the side."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.translate import chat_answer, chat_request, chat_request_writing
from gateway.translate.chat_stream import ChatStreamReading, ChatStreamWriting
from gateway.translate.neutral import Answer, Request
from gateway.translate.sides import Side


class ChatSide:
    """OpenAI's Chat Completions API, as translation reads and writes it."""

    def read_request(self, body: Mapping[str, Any]) -> Request:
        return chat_request.read_request(body)

    def write_request(self, request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
        return chat_request_writing.write_request(request)

    def read_answer(self, body: Mapping[str, Any]) -> Answer:
        return chat_answer.read_answer(body)

    def write_answer(self, answer: Answer) -> dict[str, Any]:
        return chat_answer.write_answer(answer)

    def stream_reading(self) -> ChatStreamReading:
        return ChatStreamReading()

    def stream_writing(self, usage_chunk: bool = True) -> ChatStreamWriting:
        """`usage_chunk`: the client asked for the usage (a Chat request's stream_usage)."""
        return ChatStreamWriting(usage_chunk)


CHAT: Side = ChatSide()
