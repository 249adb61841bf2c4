"""Anthropic's Messages API as a side of translation (gateway.translate.sides): its requests
(messages_request), its answers (messages_answer) and its streams (messages_stream), read into the
neutral forms and written from them; the blocks and call ids requests and answers share are
messages_blocks'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.translate.messages_answer import read_answer, write_answer
from gateway.translate.messages_request import read_request, write_request
from gateway.translate.messages_stream import MessagesStreamReading, MessagesStreamWriting
from gateway.translate.neutral import Answer, Request
from gateway.translate.sides import Side, StreamReading, StreamWriting


class MessagesSide:
    """The Messages API: a Claude Code or Anthropic SDK client's requests read and answers written;
    an Anthropic upstream's requests written and answers read."""

    def read_request(self, body: Mapping[str, Any]) -> Request:
        return read_request(body)

    def write_request(self, request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
        return write_request(request)

    def read_answer(self, body: Mapping[str, Any]) -> Answer:
        return read_answer(body)

    def write_answer(self, answer: Answer) -> dict[str, Any]:
        return write_answer(answer)

    def stream_reading(self) -> StreamReading:
        return MessagesStreamReading()

    def stream_writing(self) -> StreamWriting:
        return MessagesStreamWriting()


MESSAGES: Side = MessagesSide()
