"""One adapter per wire API, peers behind the same engine: Chat Completions (chat), the Responses
API (responses) and Anthropic's Messages (messages). gateway.apis.base says what an adapter is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.apis.messages.render import error_body as anthropic_error
from gateway.errors import BadRequest, GatewayError, openai_body

ErrorBody = Callable[[GatewayError], Mapping[str, Any]]
MESSAGES_PATH = "/v1/messages"
# Each wire API as an operator reads it, and the /v1 path its requests (and the routes below it) take.
API_TITLES = {"chat": "Chat Completions (/v1/chat/completions)", "responses": "Responses (/v1/responses)",
              "messages": "Anthropic's Messages (/v1/messages)"}
_API_PATHS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", MESSAGES_PATH: "messages"}
_API_PREFIXES = tuple(_API_PATHS)
# The wire APIs an upstream of each kind serves. The OpenAI-compatible kinds (vllm, ollama, deepseek,
# compatible) are not here: a server of theirs may serve Messages as well, or not, and says so itself.
SERVED_BY_KIND = {"openai": ("chat", "responses"), "azure": ("chat", "responses"), "anthropic": ("messages",)}


def error_body_for(path: str, headers: Mapping[str, str]) -> ErrorBody:
    """The error shape a caller reads: Anthropic's on the Messages routes and for an Anthropic client
    anywhere (its SDK and Claude Code send `anthropic-version` on every request); OpenAI's elsewhere."""
    if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/") or "anthropic-version" in headers:
        return anthropic_error
    return openai_body


def api_of_path(path: str) -> str | None:
    """The wire API a /v1 path belongs to (its create route or one below it), if any."""
    if not path.startswith(_API_PREFIXES):
        return None  # most pass-through paths: /v1/models, /v1/files ...
    for prefix, api in _API_PATHS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return api
    return None


def unserved(kind: str, api: str) -> BadRequest | None:
    """The refusal of a request of `api` when an upstream of `kind` does not serve that API (sent on,
    the provider would answer an opaque 404); None when it does, or may."""
    served = SERVED_BY_KIND.get(kind)
    if served is None or api in served:
        return None
    needs = ("an upstream of kind anthropic (upstream_kind = \"anthropic\")" if api == "messages"
             else "an upstream of kind openai or azure")
    return BadRequest(f"this gateway's upstream is of kind {kind}, which serves "
                      f"{' and '.join(API_TITLES[name] for name in served)}, not {API_TITLES[api]}: that API needs "
                      f"{needs}, or an OpenAI-compatible server that speaks it (upstream_kind vllm, ollama, "
                      "deepseek or compatible)", code="api_not_served")
