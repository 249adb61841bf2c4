"""What the spans opened under one request tell that request's span (gateway.instrumentation's
request scope): the outcomes of its tool calls, and the run's captured input and output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from telemetry import names

# Where a request's context holds its RequestTally (the OpenTelemetry context's own way to hand a
# value down to the work done under it).
_TALLY_KEY = otel_context.create_key("toolspan.request_tally")


class RequestTally:
    """What the spans opened under one request tell its span: the outcomes of its tool calls and,
    with message content captured, the first provider call's input and the last one's answer. The
    request's span puts it in the context the request runs in, the spans under it add to it, and the
    request's span reads it once, when it ends."""

    __slots__ = ("input_messages", "model", "outcomes", "output_messages", "recovered", "retried")

    def __init__(self) -> None:
        self.model: str | None = None  # the model of its first provider call: it ran the tool loop
        self.outcomes: dict[str, int] = {}
        self.retried = 0
        self.recovered = 0
        self.input_messages: str | None = None
        self.output_messages: str | None = None

    def counted(self, outcome: str, retry: bool, recovered: bool) -> None:
        """One tool call ended with `outcome`; it was a `retry` of a failed one, and `recovered`."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.retried += retry
        self.recovered += recovered

    def content(self, attributes: Mapping[str, str]) -> None:
        """A provider call's captured messages: the first call's input, the latest call's answer."""
        if self.input_messages is None:
            self.input_messages = attributes.get(names.ATTR_INPUT_MESSAGES)
        self.output_messages = attributes.get(names.ATTR_OUTPUT_MESSAGES, self.output_messages)

    def attributes(self) -> dict[str, Any]:
        """The request span's counts (every outcome seen, the retries), and its input and output when
        captured, as OpenInference and the GenAI conventions name them."""
        prefix = names.ATTR_TOOL_CALLS_PREFIX
        attributes: dict[str, Any] = {prefix + names.TOOL_CALLS_TOTAL: sum(self.outcomes.values())}
        for outcome, count in self.outcomes.items():
            attributes[prefix + outcome] = count
        if self.retried:
            attributes[prefix + names.TOOL_CALLS_RETRIED] = self.retried
            attributes[prefix + names.TOOL_CALLS_RECOVERED] = self.recovered
        if self.input_messages is not None:
            attributes.update({names.ATTR_INPUT_MESSAGES: self.input_messages,
                               names.ATTR_INPUT_VALUE: self.input_messages,
                               names.ATTR_INPUT_MIME_TYPE: names.MIME_JSON})
        if self.output_messages is not None:
            attributes.update({names.ATTR_OUTPUT_MESSAGES: self.output_messages,
                               names.ATTR_OUTPUT_VALUE: self.output_messages,
                               names.ATTR_OUTPUT_MIME_TYPE: names.MIME_JSON})
        return attributes


def request_tally(context: Context | None = None) -> RequestTally | None:
    """The tally of the request `context` (by default the current one) belongs to, if any."""
    found = otel_context.get_value(_TALLY_KEY, context)
    return found if isinstance(found, RequestTally) else None


def tally_context(tally: RequestTally, context: Context) -> Context:
    """`context` holding `tally`, for the spans opened under it to find (`request_tally`)."""
    return otel_context.set_value(_TALLY_KEY, tally, context)
