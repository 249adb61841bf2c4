"""A request of the client's API sent to an upstream in another (issue 56): the request read by the
client's side and written by the provider's, the answer read by the provider's side and written by
the client's, and a streamed answer event by event, so that the engine, the client's adapter and
everything after them see the client's API only."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.translate.chat import CHAT
from gateway.translate.messages import MESSAGES
from gateway.translate.responses import RESPONSES
from gateway.translate.sides import Side

SIDES: Mapping[str, Side] = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}
# The APIs a request of each API can be sent in, in the order to prefer them. Responses is not
# among the targets: every upstream that speaks it speaks Chat Completions too.
TRANSLATED_TO: Mapping[str, tuple[str, ...]] = {"chat": ("messages",), "messages": ("chat",),
                                                "responses": ("chat", "messages")}


@dataclass(frozen=True)
class Translation:
    """From the client's API to the provider's, and back."""

    client: str
    provider: str

    @property
    def name(self) -> str:
        """The pair, as spans and metrics name it (messages->chat)."""
        return f"{self.client}->{self.provider}"

    def request(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The provider's request, and what of the client's could not go with it."""
        neutral = SIDES[self.client].read_request(body)
        written, dropped = SIDES[self.provider].write_request(neutral)
        return written, (*neutral.dropped, *dropped)

    def answer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The provider's whole answer, as the client's API gives it."""
        return SIDES[self.client].write_answer(SIDES[self.provider].read_answer(body))

    async def events(self, events: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[dict[str, Any], None]:
        """The provider's streamed events, as the client's API streams them."""
        reading, writing = SIDES[self.provider].stream_reading(), SIDES[self.client].stream_writing()
        async for event in events:
            for neutral in reading.read(event):
                for written in writing.write(neutral):
                    yield written
        for neutral in reading.end():
            for written in writing.write(neutral):
                yield written
