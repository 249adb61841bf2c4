"""The wire APIs the gateway speaks, each its adapter (gateway.apis.base.WireApi), and what is read
of all of them: the routes they come on, the error shape a caller reads, which API a path belongs
to, and which upstream kinds serve which API. A fourth API is its package and one line here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.apis.base import WireApi
from gateway.apis.chat import CHAT
from gateway.apis.messages import MESSAGES
from gateway.apis.responses import RESPONSES
from gateway.engine.turn import Api
from gateway.errors import BadRequest, GatewayError, openai_body
from gateway.provider.routing import SERVED_BY_KIND
from gateway.provider.upstreams import Upstreams

ADAPTERS: Mapping[Api, WireApi] = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}

ErrorBody = Callable[[GatewayError], Mapping[str, Any]]
# The /v1 path of each API's requests (the routes below it are the API's too: /v1/responses/{id} ...).
_V1_PATHS = {api.paths[0]: name for name, api in ADAPTERS.items()}
_V1_PREFIXES = tuple(_V1_PATHS)
def api_of_path(path: str) -> Api | None:
    """The wire API a /v1 path belongs to (its create route or one below it), if any."""
    if not path.startswith(_V1_PREFIXES):
        return None  # most pass-through paths: /v1/models, /v1/files ...
    for prefix, api in _V1_PATHS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return api
    return None


def error_body_for(path: str, headers: Mapping[str, str]) -> ErrorBody:
    """The error shape a caller reads: its API's on that API's routes, and Anthropic's for an
    Anthropic client anywhere (its SDK and Claude Code send `anthropic-version` on every request);
    OpenAI's elsewhere."""
    api = "messages" if "anthropic-version" in headers else api_of_path(path)
    return ADAPTERS[api].error_body if api is not None else openai_body


def unserved(upstreams: Upstreams, api: Api, translated: bool = True) -> BadRequest | None:
    """The refusal of a request of `api` when no upstream speaks that API, nor (`translated`: the
    tool loop's requests) one it is translated to (sent on, the provider would answer an opaque
    404); None when one does, or may."""
    if upstreams.spoken(api, translated):
        return None
    kind = upstreams.only_kind
    served = SERVED_BY_KIND.get(kind or "")
    needs = ("an upstream of kind anthropic (upstream_kind = \"anthropic\")" if api == "messages"
             else "an upstream of kind openai or azure")
    if served is None:
        return BadRequest(f"no upstream of this gateway speaks {ADAPTERS[api].title}: that API needs {needs}, or an "
                          "OpenAI-compatible server that speaks it", code="api_not_served")
    return BadRequest(f"this gateway's upstream is of kind {kind}, which serves "
                      f"{' and '.join(ADAPTERS[name].title for name in served)}, not {ADAPTERS[api].title}: that API "
                      f"needs {needs}, or an OpenAI-compatible server that speaks it (upstream_kind vllm, ollama, "
                      "deepseek or compatible)", code="api_not_served")
