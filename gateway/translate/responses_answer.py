"""A Responses API `response` object read into the neutral answer, and written from one.

Written, the answer's parts are output items in their order: a run of texts one assistant message
(each text one output_text of it), each thinking a reasoning item (its text the summary: the
reasoning of a model of another API is no encrypted content OpenAI could read back), each call a
function_call item. An answer cut short by its token limit or a filter is an `incomplete`
response saying why. Item ids are made from the response's id and the item's place, a call's
from its call id, so that a stream of the answer and its final response name the same items.

Read, a response that failed or is not finished is the provider's failure (a 502); output items
of OpenAI's hosted tools are left out (no such tool is ever offered through translation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.translate.neutral import Answer, Stop, Text, Thinking, ToolCall, Usage, arguments_text

RESPONSE_PREFIX = "resp_"
SUMMARY_JOINER = "\n\n"  # a reasoning item's summary parts, as one thinking text
_INCOMPLETE: dict[Stop, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}
_STOPS: dict[str, Stop] = {reason: stop for stop, reason in _INCOMPLETE.items()}


def response_id(answer_id: str) -> str:
    """The answer's id as a Responses client expects one (resp_...)."""
    return answer_id if answer_id.startswith(RESPONSE_PREFIX) else RESPONSE_PREFIX + answer_id


def message_id(response: str, index: int) -> str:
    return f"msg_{response.removeprefix(RESPONSE_PREFIX)}_{index}"


def reasoning_id(response: str, index: int) -> str:
    return f"rs_{response.removeprefix(RESPONSE_PREFIX)}_{index}"


def call_item_id(call_id: str) -> str:
    return f"fc_{call_id}"


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(item_id: str, texts: list[str], status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [output_text(text) for text in texts]}


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    """A reasoning item; `text` None while it has no summary part yet."""
    summary = [] if text is None else [{"type": "summary_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": summary}


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": call_item_id(call.call_id), "call_id": call.call_id, "name": call.name,
            "arguments": call.arguments, "status": status}


def shown(part: Text | Thinking | ToolCall) -> bool:
    """A part the client is shown: all but redacted thinking (whose text is Anthropic's cipher)."""
    return not (isinstance(part, Thinking) and part.redacted)


def output_items(answer: Answer, response: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for part in filter(shown, answer.parts):
        index = len(items)
        if isinstance(part, Text):
            if items and items[-1]["type"] == "message":
                items[-1]["content"].append(output_text(part.text))
            else:
                items.append(message_item(message_id(response, index), [part.text]))
        elif isinstance(part, Thinking):
            items.append(reasoning_item(reasoning_id(response, index), part.text))
        else:
            items.append(call_item(part))
    return items


def usage_json(usage: Usage) -> dict[str, Any] | None:
    """The usage as a Responses client reads it (None when the provider told none)."""
    if usage == Usage():
        return None
    given, taken = usage.input_tokens or 0, usage.output_tokens or 0
    return {"input_tokens": given,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens or 0,
                                     "cache_write_tokens": usage.cache_write_tokens or 0},
            "output_tokens": taken, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": given + taken}


def opened_response(response: str, model: str, created_at: int) -> dict[str, Any]:
    """The response as a stream opens it: in progress, no output yet. The request's settings
    (tools, tool choice ...) are the client's adapter's to show; these are the API's defaults."""
    return {"id": response, "object": "response", "created_at": created_at, "status": "in_progress",
            "error": None, "incomplete_details": None, "instructions": None, "max_output_tokens": None,
            "model": model, "output": [], "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": None, "store": False, "temperature": None, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": None, "truncation": "disabled", "usage": None,
            "metadata": {}}


def write_answer(answer: Answer, created_at: int) -> dict[str, Any]:
    """The whole answer as a Responses client gets it."""
    response = response_id(answer.answer_id)
    reason = _INCOMPLETE.get(answer.stop)
    return {**opened_response(response, answer.model, created_at),
            "status": "completed" if reason is None else "incomplete",
            "incomplete_details": None if reason is None else {"reason": reason},
            "output": output_items(answer, response), "usage": usage_json(answer.usage)}


# --- reading ---------------------------------------------------------------------------------------

def wrong_shape(what: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the provider sent a response of the wrong shape ({what})")


def _count(values: Any, key: str) -> int | None:
    value = values.get(key) if isinstance(values, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_usage(usage: Any) -> Usage:
    details = usage.get("input_tokens_details") if isinstance(usage, Mapping) else None
    return Usage(_count(usage, "input_tokens"), _count(usage, "output_tokens"), _count(details, "cached_tokens"),
                 _count(details, "cache_write_tokens"))


def read_stop(response: Mapping[str, Any], called: bool) -> Stop:
    """Why the model stopped: a completed response ended or called tools; an incomplete one says
    why (its token limit when it names no reason the neutral answer has)."""
    if response.get("status") != "incomplete":
        return "tool_calls" if called else "end"
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    return _STOPS.get(reason, "length") if isinstance(reason, str) else "length"


def check_finished(response: Mapping[str, Any]) -> None:
    """A response that failed, or that is not finished, is the provider's failure."""
    status = response.get("status")
    if status == "failed":
        error = response.get("error")
        said = error.get("message") if isinstance(error, Mapping) else None
        raise UpstreamUnavailable(f"the provider's response failed: {said or 'no reason given'}")
    if status not in (None, "completed", "incomplete"):
        raise UpstreamUnavailable(f"the provider's response is not finished (status {status})")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise wrong_shape(what)
    return value


def message_texts(item: Mapping[str, Any]) -> list[str]:
    """An output message's texts: its output_text parts and refusals, each one text."""
    content = item.get("content")
    if not isinstance(content, list):
        raise wrong_shape("a message without content")
    return [_text(part.get("refusal" if part.get("type") == "refusal" else "text"), "a content part without text")
            for part in content if isinstance(part, Mapping) and part.get("type") in ("output_text", "refusal")]


def read_call(item: Mapping[str, Any]) -> ToolCall:
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise wrong_shape("a function call without a call id or a name")
    return ToolCall(call_id, name, arguments_text(item.get("arguments")))


def summary_text(item: Mapping[str, Any]) -> str | None:
    """A reasoning item's summary as one text; None when it has no summary part (its reasoning is
    only OpenAI's encrypted content: nothing another API could take)."""
    summary = item.get("summary")
    if not isinstance(summary, list) or not summary:
        return None
    return SUMMARY_JOINER.join(_text(part.get("text") if isinstance(part, Mapping) else None, "a summary without text")
                               for part in summary)


def _item_parts(item: Any) -> list[Text | Thinking | ToolCall]:
    kind = item.get("type") if isinstance(item, Mapping) else None
    if kind == "message":
        return [Text(text) for text in message_texts(item)]
    if kind == "function_call":
        return [read_call(item)]
    if kind == "reasoning" and (text := summary_text(item)) is not None:
        return [Thinking(text)]
    return []


def read_answer(body: Mapping[str, Any]) -> Answer:
    """A Responses provider's whole answer; an UpstreamUnavailable when it is not one."""
    output = body.get("output") if isinstance(body, Mapping) else None
    if not isinstance(output, list):
        raise wrong_shape("no output")
    check_finished(body)
    parts = tuple(part for item in output for part in _item_parts(item))
    return Answer(_text(body.get("id"), "no id"), _text(body.get("model"), "no model"), parts,
                  read_stop(body, any(isinstance(part, ToolCall) for part in parts)), read_usage(body.get("usage")))
