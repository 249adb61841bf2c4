"""Which headers cross the gateway, in each direction. One place, for every route.

Caller -> provider: everything but hop-by-hop headers, the gateway's own (its keys, its trajectory
header), headers that describe a body the gateway writes anew, and cookies; the caller's
credentials (and the account headers that go with them, and any header the redact list names)
only when the provider call is made with them. The trace context goes on as the caller sent it
unless the gateway's own tracing writes its own over it.
Provider -> caller: everything but hop-by-hop headers, the account behind the gateway, cookies,
and headers that describe a body the gateway writes anew.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote_plus

TRAJECTORY_HEADER = "X-Trajectory-Id"  # names the trajectory; every response carries it
_TRAJECTORY_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
TRACE_HEADER = "X-Trace-Id"  # names the request's trace, when there is one

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length", "host", "expect",
})
BODY = frozenset({"content-type", "content-encoding", "content-length"})  # describe the body as sent
CREDENTIALS = frozenset({"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"})
_CALLER_ONLY = frozenset({"x-trajectory-id", "cookie", "accept-encoding"})
# Provider answers that would tell callers which account is behind the gateway, or set cookies on
# the gateway's origin; the headers aiohttp writes itself; and the gateway's own (a provider that is
# another gateway sends them too: the caller must see this one's).
_PROVIDER_ONLY = frozenset({"openai-organization", "openai-project", "set-cookie", "date", "server", "x-trace-id",
                            "x-trajectory-id", "x-toolspan-rounds", "x-toolspan-round-limit",
                            # the provider's origin policy and transport are its own, not the gateway's
                            "alt-svc", "strict-transport-security"})
_PROVIDER_ONLY_PREFIX = "access-control-"  # CORS: browsers must not read the gateway's answers by the provider's


_NOT_TO_PROVIDER = HOP_BY_HOP | BODY | _CALLER_ONLY
_NOT_TO_PROVIDER_NOR_CREDENTIALS = _NOT_TO_PROVIDER | CREDENTIALS


def is_trajectory_id(value: object) -> bool:
    """Ids we accept from callers (the trajectory header's, and what the state keeps of them):
    short, and safe in headers, labels and logs."""
    return isinstance(value, str) and _TRAJECTORY_ID.fullmatch(value) is not None


def named_trajectory(metadata: object) -> str | None:
    """The trajectory a request's `metadata` names (its `trajectory_id`), when that is an id we accept."""
    named = metadata.get("trajectory_id") if isinstance(metadata, dict) else None
    return named if isinstance(named, str) and is_trajectory_id(named) else None


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    """Headers the Connection header names: hop-by-hop as well (RFC 9110, 7.6.1)."""
    listed = headers.get("Connection") or headers.get("connection") or ""
    return frozenset(t.strip().lower() for t in listed.split(",") if t.strip())


# Query parameters that carry a credential by these names alone (API keys, tokens, Azure's SAS
# signature); names containing a redact key are matched besides.
QUERY_CREDENTIALS = ("api_key", "api-key", "key", "token", "access_token", "sig")
_QUERY_CREDENTIALS = frozenset(name.replace("-", "_") for name in QUERY_CREDENTIALS)


@dataclass(frozen=True)
class SecretNames:
    """Names that hold a secret: those containing any of the redact keys, in any letter case, '-'
    and '_' alike (the rule the argument masking on spans follows)."""

    keys: tuple[str, ...]  # lower case, '-' written as '_'

    def holds(self, name: str) -> bool:
        return self._in(name.lower().replace("-", "_"))

    def any_of(self, names: Iterable[str]) -> bool:
        """Whether any of `names` holds a secret, in one pass over them all (no key holds a line
        break, so none is found across two names)."""
        return self._in("\n".join(names).lower().replace("-", "_"))

    def is_credential_parameter(self, name: str) -> bool:
        """A query parameter (its name decoded) that carries a credential."""
        normal = name.lower().replace("-", "_")
        return normal in _QUERY_CREDENTIALS or self._in(normal)

    def without_credentials(self, query: str, mask: str | None = None) -> str:
        """A query string (as sent) with its credential parameters left out, or (`mask`) their
        values replaced by it; names compared percent-decoded, the rest as it was sent."""
        parts = []
        for part in query.split("&") if query else ():
            name, equals, _ = part.partition("=")
            if not self.is_credential_parameter(unquote_plus(name)):
                parts.append(part)
            elif mask is not None:
                parts.append(f"{name}={mask}" if equals else part)
        return "&".join(parts)

    def _in(self, normal: str) -> bool:
        # Substring tests rather than one regex of alternatives: quicker over a client's dozen
        # header names, and this runs on every request with keys.
        return any(key in normal for key in self.keys)


def secret_names(redact_keys: tuple[str, ...]) -> SecretNames:
    """The rule for `redact_keys` (made once, when the app is: see gateway.app)."""
    return SecretNames(tuple(sorted({k.lower().replace("-", "_") for k in redact_keys if k})))


def to_provider(headers: Mapping[str, str], with_credentials: bool,
                secret: SecretNames | None = None) -> dict[str, str]:
    """The caller's headers that travel with a provider call whose body the gateway writes.
    Without the caller's credentials, a header whose name `secret` holds stays behind too."""
    dropped = _NOT_TO_PROVIDER if with_credentials else _NOT_TO_PROVIDER_NOR_CREDENTIALS
    if "Connection" in headers or "connection" in headers:
        dropped = dropped | _connection_tokens(headers)
    kept = {k: v for k, v in headers.items() if k.lower() not in dropped}
    # Most requests name no secret header: one search over all the names tells, one per name only then.
    if with_credentials or secret is None or not secret.any_of(kept):
        return kept
    return {k: v for k, v in kept.items() if not secret.holds(k)}


_NOT_TO_CALLER = HOP_BY_HOP | _PROVIDER_ONLY
_NOT_TO_CALLER_NOR_BODY = _NOT_TO_CALLER | BODY


def body_headers(headers: Mapping[str, str], decoded: bool) -> dict[str, str]:
    """The caller's headers that describe a body passed on byte for byte (and the encodings it
    accepts back); `decoded`: the body was decoded on the way in, so its encoding no longer holds."""
    kept = {"content-type", "accept-encoding"} if decoded else {"content-type", "content-encoding", "accept-encoding"}
    return {k: v for k, v in headers.items() if k.lower() in kept}


def from_provider(headers: Mapping[str, str], body_as_sent: bool = False) -> dict[str, str]:
    """The provider's headers that reach the caller. `body_as_sent`: the provider's body goes on
    byte for byte, so the headers that describe it go too."""
    dropped = _NOT_TO_CALLER if body_as_sent else _NOT_TO_CALLER_NOR_BODY
    return {k: v for k, v in headers.items()
            if (name := k.lower()) not in dropped and not name.startswith(_PROVIDER_ONLY_PREFIX)}
