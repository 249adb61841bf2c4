"""The session the improve tests read is recorded as its hand counts say."""

from __future__ import annotations

from collections import Counter

from tests.improve import session as scripted
from tests.improve.conftest import Session


def test_the_session_is_recorded_as_counted(improve_session: Session) -> None:
    db = improve_session.db
    calls = db.execute("SELECT tool, outcome, rejection_reason, arguments FROM tool_calls").fetchall()
    assert len(calls) == scripted.CALLS
    assert all(arguments is not None for _, _, _, arguments in calls)  # every call's, recorded
    reasons = Counter(reason for _, _, reason, _ in calls if reason)
    assert reasons == {"missing_arguments": 3, "schema_violation": 2}
    upstreams = Counter(row[0] for row in db.execute("SELECT upstream FROM model_turns"))
    assert upstreams == {"primary": scripted.ROUNDS_BY_MODEL[scripted.MODEL_A],
                         "secondary": scripted.ROUNDS_BY_MODEL[scripted.MODEL_B]}
    assert scripted.SECRET not in "".join(str(a) for *_, a in calls)
