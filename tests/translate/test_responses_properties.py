"""Properties of the Responses side (gateway.translate.responses), for random requests and answers
within what the Responses API can express: written and read back, each is what it was; an answer
streamed (its pieces cut anywhere, its parts interleaved) and read back is the answer, and the
stream's final response is the whole answer as written; what is written is what openai-python's
models take; and reading anything at all fails, if it fails, with the API's own error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.responses import ResponseStreamState

from gateway.errors import BadRequest, GatewayError, UpstreamUnavailable
from gateway.translate.neutral import Answer, Request
from tests.translate.chat_streams import assembled
from tests.translate.responses_cases import (
    SIDE,
    STREAM_EVENT,
    answers,
    in_order,
    read,
    requests,
    told,
    valid_request,
    valid_response,
    written,
)

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(requests())
def test_a_request_written_and_read_back_is_the_same(request: Request) -> None:
    body, dropped = SIDE.write_request(request)
    assert dropped == ()
    valid_request(body)
    assert SIDE.read_request(body) == request


@QUICK
@given(answers())
def test_an_answer_written_and_read_back_is_the_same(answer: Answer) -> None:
    body = SIDE.write_answer(answer)
    valid_response(body)
    assert SIDE.read_answer(body) == answer


@QUICK
@given(st.data(), answers())
def test_an_answer_streamed_and_read_back_is_the_same(data: st.DataObject, answer: Answer) -> None:
    events = written(data.draw(told(answer)))
    in_order(events)
    assert events[-1]["response"] == SIDE.write_answer(answer)
    assert assembled(read(events)) == answer


@QUICK
@given(st.data(), answers())
def test_openai_python_assembles_a_written_stream_into_the_whole_answer(data: st.DataObject, answer: Answer) -> None:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=openai.omit)
    for event in written(data.draw(told(answer))):
        shown = state.handle_event(STREAM_EVENT.validate_python(event))
    [closing] = shown
    assert closing.type in ("response.completed", "response.incomplete")
    assert SIDE.read_answer(closing.response.model_dump(mode="json")) == answer


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(["type", "role", "content", "text", "call_id", "name",
                                                              "arguments", "output", "summary", "input", "tools",
                                                              "model", "image_url", "file_id", "status", "output_index",
                                                              "content_index", "item", "response", "delta"]),
                                             inner, max_size=5),
                           max_leaves=25)
typed = st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "input_text",
                         "input_image", "output_text", "function", "response.created", "response.output_item.added",
                         "response.output_item.done", "response.output_text.delta", "response.completed"])


def _typed(value: Any, kind: str) -> Any:
    return {**value, "type": kind} if isinstance(value, dict) else value


shaped = st.builds(_typed, json_values, typed) | json_values


def _failure(attempt: Callable[[], object]) -> GatewayError | None:
    """The gateway's error the attempt failed with, if it failed (any other exception escapes)."""
    try:
        attempt()
    except GatewayError as error:
        return error
    return None


@QUICK
@given(st.dictionaries(st.sampled_from(["model", "input", "tools", "tool_choice", "instructions", "text",
                                        "max_output_tokens", "stream", "temperature"]), shaped))
def test_reading_any_request_fails_only_with_a_bad_request(body: dict[str, Any]) -> None:
    error = _failure(lambda: SIDE.read_request(body))
    assert error is None or (isinstance(error, BadRequest) and error.status == 400 and error.param)


@QUICK
@given(st.dictionaries(st.sampled_from(["id", "model", "status", "output", "usage", "incomplete_details"]), shaped),
       st.lists(shaped, max_size=6))
def test_reading_any_answer_or_stream_fails_only_as_the_provider_s_failure(body: dict[str, Any],
                                                                         events: list[Any]) -> None:
    for attempt in (lambda: SIDE.read_answer(body), lambda: read(e for e in events if isinstance(e, dict))):
        error = _failure(attempt)
        assert error is None or (isinstance(error, UpstreamUnavailable) and error.status == 502)
