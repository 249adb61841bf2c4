"""How many /mcp sessions each gateway key holds, so that one key cannot take every session there is.

The SDK's session manager bounds the sessions of all keys together and ends a session that has
been idle for the timeout; it keeps no count per key. `KeySessions` keeps one, learnt from the
exchanges the endpoint passes on: an answer below 400 that carries a session id, to a request that
named none, opens a session; a DELETE answered below 400, or a 404 for the session, ends it; and a
session with no request in flight for the idle timeout counts as gone, as the SDK ends it then.
Our idle clock restarts once the answer is complete, a moment after the SDK's, so a session is
never counted gone while the SDK still holds it.

When every session the SDK may hold is taken, the rule of gateway.state.fair says whose makes room
for a key's new one (`to_end`): the least recently used idle session of the key holding the most,
unless that key is the one asking (the SDK then refuses it, as before).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import GatewayError
from gateway.state.fair import fair_victim


class TooManySessions(GatewayError):
    """A key asked for another /mcp session while it holds as many as it may."""

    status = 429
    type = "rate_limit_error"


@dataclass
class _Session:
    last_used: float  # when its last request ended (the clock's reading)
    in_flight: int = 0  # requests being answered: while there are any, the SDK does not end it


@dataclass
class _Held:
    """One key's sessions, and its requests under way that may open one (the SDK counts those
    already, from the moment it takes them)."""

    sessions: dict[str, _Session] = field(default_factory=dict)
    opening: int = 0


@dataclass(frozen=True)
class Visit:
    """One request's passage: by which key, to which session (None: a request that may open one)."""

    principal: str
    session_id: str | None
    session: _Session | None = None  # the session whose request count it raised


class KeySessions:
    """The /mcp sessions each gateway key has open, at most `per_key` each.

    Memory is bounded by what the SDK holds: a session is added only once the SDK has answered
    for it, and the names are those of configured keys."""

    def __init__(self, per_key: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_key = per_key
        self._idle = idle_seconds
        self._clock = clock
        self._held: dict[str, _Held] = {}

    def enter(self, principal: str, session_id: str | None) -> Visit:
        """A request by `principal` begins: to `session_id`, or (None) one that may open a session,
        which is refused with TooManySessions when the key holds its bound already."""
        if session_id is not None:
            held = self._held.get(principal)
            session = held.sessions.get(session_id) if held is not None else None
            if session is not None:
                session.in_flight += 1
            return Visit(principal, session_id, session)
        held = self._held.setdefault(principal, _Held())
        now = self._clock()
        self._forget_idle(held, now)
        if len(held.sessions) + held.opening >= self._per_key:
            raise self._refusal(held, now)
        held.opening += 1
        return Visit(principal, None)

    def leave(self, visit: Visit, status: int | None, answered_session: str | None, *, deleting: bool) -> None:
        """The request has ended: answered with `status` and the session id its answer carried
        (None for both when it ended before an answer began)."""
        now = self._clock()
        answered = status is not None and status < 400
        if visit.session is not None:
            visit.session.in_flight -= 1
            visit.session.last_used = now
        held = self._held.setdefault(visit.principal, _Held())
        if visit.session_id is None:
            held.opening -= 1
            if answered and answered_session is not None:
                held.sessions[answered_session] = _Session(now)
        elif status == 404 or (deleting and answered):  # the SDK does not know it (any more)
            held.sessions.pop(visit.session_id, None)
        elif answered and answered_session == visit.session_id and visit.session_id not in held.sessions:
            # The SDK still served a session we had counted gone (its timer fires a moment after ours).
            held.sessions[visit.session_id] = _Session(now)
        if not held.sessions and not held.opening:
            del self._held[visit.principal]

    def to_end(self, principal: str, capacity: int) -> tuple[str, str] | None:
        """(key, session id) of the session to end so that `principal`'s opening request (entered
        already) finds room among `capacity` sessions; None when there is room, when `principal`
        holds the most, or when every session of the key holding the most has a request in flight."""
        now = self._clock()
        for held in self._held.values():
            self._forget_idle(held, now)
        counts = {key: len(held.sessions) + held.opening for key, held in self._held.items()}
        if sum(counts.values()) <= capacity:
            return None

        def idle(key: str) -> list[tuple[float, str]]:
            return sorted((s.last_used, sid) for sid, s in self._held[key].sessions.items() if not s.in_flight)

        victim = fair_victim(counts, lambda key: min(idle(key), default=(math.inf, ""))[0])
        ending = idle(victim) if victim != principal else []
        return (victim, ending[0][1]) if ending else None

    def _forget_idle(self, held: _Held, now: float) -> None:
        expired = [sid for sid, s in held.sessions.items() if not s.in_flight and now - s.last_used >= self._idle]
        for session_id in expired:
            del held.sessions[session_id]

    def _refusal(self, held: _Held, now: float) -> TooManySessions:
        # When the least recently used idle session ends; with none idle, a whole idle period at least.
        ends = [s.last_used + self._idle - now for s in held.sessions.values() if not s.in_flight]
        wait = max(1, math.ceil(min(ends, default=self._idle)))
        return TooManySessions(
            f"this key has {len(held.sessions) + held.opening} MCP sessions open, as many as "
            f"mcp_max_sessions_per_key allows: end one (DELETE /mcp with its Mcp-Session-Id), or try again "
            f"in {wait} s (a session ends after mcp_session_idle_seconds without a request)",
            code="too_many_sessions", headers={"Retry-After": str(wait)})
