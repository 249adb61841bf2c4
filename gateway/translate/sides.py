"""What each wire API gives translation (gateway.translate): its requests, answers and streamed
answers read into the neutral forms (gateway.translate.neutral) and written from them. A side that
reads is the client's API for requests and the provider's for answers; a side that writes, the
other way round."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gateway.translate.neutral import Answer, Request, StreamEvent


class StreamReading(Protocol):
    """Reads one streamed answer of the provider's API, event by event (each event as
    gateway.provider.sse decodes it: the JSON of its data)."""

    def read(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """The neutral events one provider event says (none, one, or several)."""

    def end(self) -> list[StreamEvent]:
        """The neutral events still due when the provider's stream has ended (Chat says its
        usage after its finish reason: the end is known only then)."""


class StreamWriting(Protocol):
    """Writes one streamed answer in the client's API, event by event."""

    def write(self, event: StreamEvent) -> list[dict[str, Any]]:
        """The client API's events (the JSON of each one's data) for one neutral event."""


class Side(Protocol):
    """One wire API, as translation reads and writes it."""

    def read_request(self, body: Mapping[str, Any]) -> Request:
        """A request of this API; a BadRequest naming the field for what no other API can say."""

    def write_request(self, request: Request) -> tuple[dict[str, Any], tuple[str, ...]]:
        """A request of this API, and what of the neutral request it could not say and left out
        (e.g. "thinking"); together with `request.dropped`, the span says what was lost."""

    def read_answer(self, body: Mapping[str, Any]) -> Answer:
        """A provider's whole answer in this API; an UpstreamUnavailable when it is not one."""

    def write_answer(self, answer: Answer) -> dict[str, Any]:
        """The whole answer as this API gives it to its client."""

    def stream_reading(self) -> StreamReading: ...

    def stream_writing(self) -> StreamWriting: ...
