"""One adapter per wire API, peers behind the same engine: Chat Completions (chat), the Responses
API (responses) and Anthropic's Messages (messages). gateway.apis.base says what an adapter is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.apis.messages.render import error_body as anthropic_error
from gateway.errors import GatewayError, openai_body

ErrorBody = Callable[[GatewayError], Mapping[str, Any]]
MESSAGES_PATH = "/v1/messages"


def error_body_for(path: str, headers: Mapping[str, str]) -> ErrorBody:
    """The error shape a caller reads: Anthropic's on the Messages routes and for an Anthropic client
    anywhere (its SDK and Claude Code send `anthropic-version` on every request); OpenAI's elsewhere."""
    if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/") or "anthropic-version" in headers:
        return anthropic_error
    return openai_body
