"""Who sent a request: resolved once per request, by the app's middleware, into a frozen Caller."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Unauthorized
from gateway.settings.parts import ClientCheckMode, GatewayKey
from gateway.tools import Turn
from gateway.tools.approvals import ClientDecision
from gateway.wire.headers import TRAJECTORY_HEADER, SecretNames, is_trajectory_id, to_provider


@dataclass(frozen=True)
class Caller:
    """The caller of one request: identity, the tools it may use, its trajectory."""

    trajectory_id: str
    request_id: str
    principal: str | None = None  # the gateway key's name
    allowed: frozenset[str] | None = None  # tools that key may use; None: every registered tool
    upstream_headers: Mapping[str, str] = field(default_factory=dict)  # what travels on to the provider
    trajectory_named: bool = False  # the caller named the trajectory in the X-Trajectory-Id header
    metadata: Mapping[str, Any] = field(default_factory=dict)
    routes: tuple[str, ...] | None = None  # pass-through path prefixes that key may use; None: every one
    # Set when the provider is called with the gateway's key: the caller's query-string credentials stay here too.
    query_secret: SecretNames | None = None
    # How the request's trajectory was found when the header named none (gateway.linking): "metadata",
    # "previous_response", "call_ids", "session_header"; None: the header's, or a new one.
    linked_by: str | None = None
    client_tool_check: ClientCheckMode | None = None  # the key's own client_tool_check; None: the gateway's
    models: tuple[str, ...] | None = None  # models (names, glob patterns) that key may ask for; None: every one

    @property
    def trajectory_source(self) -> str:
        """How the trajectory was found: header, metadata, previous_response, call_ids, session_header or new."""
        if self.trajectory_named:
            return "header"
        return self.linked_by or "new"

    def client_check(self, default: ClientCheckMode) -> ClientCheckMode:
        """What this caller's requests do with the client calls that do not fit: its key's, else `default`."""
        return self.client_tool_check or default

    def provider_query(self, query: str) -> str:
        """The caller's query string as it goes to the provider."""
        return query if self.query_secret is None or not query else self.query_secret.without_credentials(query)

    def turn(self, round_: int, declared: frozenset[str] = frozenset(), asks_client: frozenset[str] = frozenset(),
             decided: Mapping[str, ClientDecision] | None = None) -> Turn:
        """What the tools of one model turn are told about the caller; and, of a Responses request's
        declared MCP servers, their tools, those whose calls wait for the client, its decisions."""
        return Turn(trajectory_id=self.trajectory_id, request_id=self.request_id, principal=self.principal,
                    metadata=self.metadata, round=round_, declared=declared, asks_client=asks_client,
                    decided=decided or {})


def request_ids(headers: Mapping[str, str]) -> tuple[str, str, bool]:
    """(trajectory id, request id, whether the caller named the trajectory) of a request: the
    X-Trajectory-Id header when it is a usable id, else a fresh one.

    A fresh trajectory id is 32 hex digits: the milliseconds since the epoch in the first 12 (as a
    UUIDv7 begins), 80 random bits after them. Ids that grow with time are appended to the ends of
    the trajectory store's indexes (`telemetry.store.schema.SCHEMA`) rather than written on random pages."""
    sent = headers.get(TRAJECTORY_HEADER)
    named = is_trajectory_id(sent)
    drawn = secrets.token_hex(18)  # the random part of a trajectory id, should the caller name none, and a request id
    fresh = f"{time.time_ns() // 1_000_000:012x}{drawn[:20]}"
    return (str(sent) if named else fresh), drawn[20:], named


def resolve_caller(headers: Mapping[str, str], ids: tuple[str, str, bool], keys: Mapping[str, GatewayKey],
                   authenticate: bool, own_key: bool, secret: SecretNames) -> Caller:
    """The caller of a request. Without gateway keys, its credentials are the provider's business
    (unless the gateway calls the provider with its `own_key`); with them, it must send one of them
    (as `Authorization: Bearer`, or as Azure clients do, `api-key`, or as Anthropic's do, `x-api-key`;
    a 401 otherwise), and that key
    stops here. Whenever the caller's credentials stay here, so does every header and query
    parameter that holds a secret by its name (`secret`: the redact list's rule)."""
    trajectory_id, request_id, named = ids
    if not authenticate:
        return Caller(trajectory_id, request_id, trajectory_named=named)
    if not keys and not own_key:
        return Caller(trajectory_id, request_id, upstream_headers=to_provider(headers, with_credentials=True),
                      trajectory_named=named)
    upstream_headers = to_provider(headers, with_credentials=False, secret=secret)
    if not keys:
        return Caller(trajectory_id, request_id, upstream_headers=upstream_headers, trajectory_named=named,
                      query_secret=secret)
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        token = headers.get("api-key") or headers.get("x-api-key", "")
    token = token.strip()
    for name, spec in keys.items():
        if token and hmac.compare_digest(token.encode(), spec.key.get_secret_value().encode()):
            allowed = None if spec.tools is None else frozenset(spec.tools)
            routes = None if spec.routes is None else tuple(spec.routes)
            models = None if spec.models is None else tuple(spec.models)
            return Caller(trajectory_id, request_id, name, allowed, upstream_headers, named, routes=routes,
                          query_secret=secret, client_tool_check=spec.client_tool_check, models=models)
    raise Unauthorized("this gateway needs one of its keys: send Authorization: Bearer <key> (or x-api-key: <key>)",
                       code="invalid_api_key")
