"""The OpenAI Responses API as a side of translation (gateway.translate.sides): a Responses
client's requests (the Codex CLI, the Agents SDK, openai's `client.responses`) read and its
answers and streams written, for an upstream that speaks Chat Completions or Messages; and a
Responses upstream's requests written and answers read. The pieces: responses_request (reading a
request), responses_input (writing one), responses_answer (the response object both ways),
responses_stream (writing a stream) and responses_stream_reading (reading one)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.translate.neutral import Answer, Request
from gateway.translate.responses_answer import read_answer, write_answer
from gateway.translate.responses_input import write_request
from gateway.translate.responses_request import read_request
from gateway.translate.responses_stream import ResponsesStreamWriting
from gateway.translate.responses_stream_reading import ResponsesStreamReading
from gateway.translate.sides import Side, StreamReading, StreamWriting


@dataclass(frozen=True)
class ResponsesSide:
    """The Responses API. `clock`: the time a written response says it was created at."""

    clock: Callable[[], float] = time.time

    def read_request(self, body: Mapping[str, Any]) -> Request:
        return read_request(body)

    def write_request(self, request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
        return write_request(request)

    def read_answer(self, body: Mapping[str, Any]) -> Answer:
        return read_answer(body)

    def write_answer(self, answer: Answer) -> dict[str, Any]:
        return write_answer(answer, int(self.clock()))

    def stream_reading(self) -> StreamReading:
        return ResponsesStreamReading()

    def stream_writing(self) -> StreamWriting:
        return ResponsesStreamWriting(int(self.clock()))


RESPONSES: Side = ResponsesSide()
