"""KeySessions on a clock of the test's: when a session counts as gone, what Retry-After says, and
that nothing is kept of a key without sessions. (tests/e2e/test_mcp_sessions.py runs it behind
/mcp with the SDK.)"""

from __future__ import annotations

import pytest

from gateway.mcp.key_sessions import KeySessions, TooManySessions
from tests.conftest import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_one(sessions: KeySessions, key: str, session_id: str) -> None:
    sessions.leave(sessions.enter(key, None), 200, session_id, deleting=False)


def refusal(sessions: KeySessions, key: str) -> TooManySessions:
    with pytest.raises(TooManySessions) as refused:
        sessions.enter(key, None)
    return refused.value


def test_an_idle_session_counts_until_its_timeout_and_retry_after_says_when(clock: Clock) -> None:
    sessions = KeySessions(per_key=2, idle_seconds=60, clock=clock)
    open_one(sessions, "a", "s1")
    clock.now += 20
    open_one(sessions, "a", "s2")
    clock.now += 10.5
    assert refusal(sessions, "a").headers["Retry-After"] == "30"  # s1 was last used 30.5 s ago
    clock.now += 29.5
    open_one(sessions, "a", "s3")  # s1 is gone now
    assert refusal(sessions, "a").headers["Retry-After"] == "20"  # s2 next


def test_a_session_with_a_request_in_flight_does_not_expire(clock: Clock) -> None:
    """As in the SDK: an open event stream holds its session however long it lasts."""
    sessions = KeySessions(per_key=1, idle_seconds=60, clock=clock)
    open_one(sessions, "a", "s1")
    stream = sessions.enter("a", "s1")
    clock.now += 3600
    assert refusal(sessions, "a").headers["Retry-After"] == "60"  # none idle: a whole period at least
    sessions.leave(stream, 200, "s1", deleting=False)
    clock.now += 59
    refusal(sessions, "a")
    clock.now += 1
    open_one(sessions, "a", "s2")


def test_an_opening_request_holds_a_place_until_it_is_answered(clock: Clock) -> None:
    sessions = KeySessions(per_key=1, idle_seconds=60, clock=clock)
    opening = sessions.enter("a", None)
    refusal(sessions, "a")
    sessions.leave(opening, None, None, deleting=False)  # cancelled before any answer
    failed = sessions.enter("a", None)
    sessions.leave(failed, 400, "s1", deleting=False)  # the SDK refused it: no session
    open_one(sessions, "a", "s2")
    refusal(sessions, "a")
    open_one(sessions, "b", "s3")  # another key's share is its own


@pytest.mark.parametrize(("status", "deleting"), [(200, True), (404, False)], ids=["deleted", "unknown-to-the-sdk"])
def test_a_session_the_sdk_no_longer_holds_frees_its_place(clock: Clock, status: int, deleting: bool) -> None:
    sessions = KeySessions(per_key=1, idle_seconds=60, clock=clock)
    open_one(sessions, "a", "s1")
    sessions.leave(sessions.enter("a", "s1"), status, "s1" if status < 400 else None, deleting=deleting)
    open_one(sessions, "a", "s2")


def test_a_session_the_sdk_still_serves_is_counted_again(clock: Clock) -> None:
    """Counted gone a moment before the SDK's timer ended it, then served after all: it counts."""
    sessions = KeySessions(per_key=1, idle_seconds=60, clock=clock)
    open_one(sessions, "a", "s1")
    clock.now += 60
    late = sessions.enter("a", "s1")
    sessions.leave(late, 200, "s1", deleting=False)
    refusal(sessions, "a")
    stray = sessions.enter("a", "s9")  # a request for a session of no one's: the SDK's 404
    sessions.leave(stray, 404, None, deleting=False)
    refusal(sessions, "a")


def test_nothing_is_kept_of_a_key_without_sessions(clock: Clock) -> None:
    sessions = KeySessions(per_key=3, idle_seconds=60, clock=clock)
    for n in range(3):
        open_one(sessions, "a", f"s{n}")
    for n in range(3):
        sessions.leave(sessions.enter("a", f"s{n}"), 200, f"s{n}", deleting=True)
    sessions.leave(sessions.enter("b", "elsewhere"), 404, None, deleting=False)
    assert not sessions._held  # what it keeps: the memory bound is the point of this test
