"""Who sent a request: resolved once per request, by the app's middleware, into a frozen Caller."""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.errors import Unauthorized
from gateway.settings import GatewayKey
from gateway.tools import Turn

TRAJECTORY_HEADER = "X-Trajectory-Id"
_TRAJECTORY_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def is_trajectory_id(value: object) -> bool:
    """Ids we accept from callers: short, and safe in headers, labels and logs."""
    return isinstance(value, str) and _TRAJECTORY_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class Caller:
    """The caller of one request: identity, the tools it may use, its trajectory."""

    trajectory_id: str
    request_id: str
    principal: str | None = None  # the gateway key's name
    allowed: frozenset[str] | None = None  # tools that key may use; None: every registered tool
    upstream_authorization: str | None = None  # what may travel on to the provider
    trajectory_named: bool = False  # the caller named the trajectory in the X-Trajectory-Id header
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def with_metadata(self, metadata: object) -> Caller:
        """This caller as a request's `metadata` describes it: the metadata reaches tools, and its
        `trajectory_id` counts when the header named none."""
        if not isinstance(metadata, dict):
            return self
        named = metadata.get("trajectory_id")
        trajectory = named if not self.trajectory_named and is_trajectory_id(named) else self.trajectory_id
        return replace(self, metadata=metadata, trajectory_id=str(trajectory))

    def turn(self, round_: int) -> Turn:
        """What the tools of one model turn are told about the caller."""
        return Turn(trajectory_id=self.trajectory_id, request_id=self.request_id, principal=self.principal,
                    metadata=self.metadata, round=round_)


def identify(headers: Mapping[str, str]) -> Caller:
    """A request's caller before authentication: its trajectory and a fresh request id."""
    sent = headers.get(TRAJECTORY_HEADER)
    fresh = secrets.token_hex(24)  # a trajectory id, should the caller name none, and a request id
    named = is_trajectory_id(sent)
    return Caller(trajectory_id=str(sent) if named else fresh[:32], request_id=fresh[32:], trajectory_named=named)


def authenticate(caller: Caller, headers: Mapping[str, str], keys: Mapping[str, GatewayKey]) -> Caller:
    """Without gateway keys, the caller's Authorization is the provider's business; with them, it
    must name one of them, and it stops here."""
    authorization = headers.get("Authorization")
    if not keys:
        return replace(caller, upstream_authorization=authorization)
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    for name, spec in keys.items():
        if token and hmac.compare_digest(token.encode(), spec.key.get_secret_value().encode()):
            return replace(caller, principal=name, allowed=None if spec.tools is None else frozenset(spec.tools))
    raise Unauthorized("this gateway needs one of its keys: send Authorization: Bearer <key>", code="invalid_api_key")
