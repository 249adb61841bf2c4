"""The trajectory store at its size limit (issue 32): a batch that does not fit makes its room from
the oldest trajectories, and only a batch larger than the whole store loses anything of its own,
its oldest part, counted.

The spans come from a real TracerProvider through the real TrajectoryStore into a real file, shaped
as the gateway makes them: a request (SERVER) span naming its trajectory, two `chat` turns and a
`tool.call` under it."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Tracer

from telemetry import names
from telemetry.store.writer import TrajectoryStore

OLD, NEW = 60, 500
SPANS_EACH = 4  # a request, two model turns, a tool call


@dataclass
class Limited:
    store: TrajectoryStore
    tracer: Tracer
    dropped: list[tuple[str, int]] = field(default_factory=list)

    def trajectories(self, prefix: str, count: int, payload: int) -> None:
        """`count` trajectories of one request each, then every span written in one batch."""
        for number in range(count):
            trajectory = f"{prefix}-{number:04}"
            with self.tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                                   attributes={names.ATTR_CONVERSATION_ID: trajectory}):
                self._turn()
                with self.tracer.start_as_current_span(names.SPAN_TOOL_CALL, attributes={
                        names.ATTR_TOOL_NAME: "add", names.ATTR_CONVERSATION_ID: trajectory,
                        names.ATTR_OUTCOME: "ok", names.ATTR_TOOL_CALL_ARGUMENTS: "x" * payload}):
                    pass
                self._turn()
        assert self.store.flush(60.0)

    def _turn(self) -> None:
        with self.tracer.start_as_current_span(f"{names.SPAN_CHAT_PREFIX} demo", kind=SpanKind.CLIENT,
                                               attributes={names.ATTR_REQUEST_MODEL: "demo"}):
            pass

    def kept(self) -> list[str]:
        with sqlite3.connect(self.store.path) as db:
            return [row[0] for row in db.execute("SELECT id FROM trajectories ORDER BY id")]

    def waiting(self) -> int:
        """The model turns waiting for their request (kept under no trajectory)."""
        with sqlite3.connect(self.store.path) as db:
            return int(db.execute("SELECT COUNT(*) FROM model_turns WHERE trajectory_id = ''").fetchone()[0])

    def rows(self, trajectory_prefix: str) -> int:
        with sqlite3.connect(self.store.path) as db:
            return sum(db.execute(f"SELECT COUNT(*) FROM {table} WHERE trajectory_id LIKE ?",
                                  (f"{trajectory_prefix}-%",)).fetchone()[0]
                       for table in ("requests", "model_turns", "tool_calls"))


LIMIT = 1024 * 1024


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Limited]:
    dropped: list[tuple[str, int]] = []
    # One batch for each call of `trajectories` (a whole batch or a flush ends it, never the clock).
    store = TrajectoryStore(tmp_path / "store.sqlite3", max_bytes=LIMIT, batch_size=4096, linger_seconds=600.0,
                            dropped=lambda reason, count: dropped.append((reason, count)))
    provider = TracerProvider()
    provider.add_span_processor(store)
    try:
        yield Limited(store, provider.get_tracer("test"), dropped)
    finally:
        provider.shutdown()


def test_a_batch_that_does_not_fit_makes_room_from_the_oldest(limited: Limited) -> None:
    limited.trajectories("old", OLD, payload=12_000)  # about 0.8 of the limit
    assert limited.kept() == [f"old-{n:04}" for n in range(OLD)]
    limited.trajectories("new", NEW, payload=600)  # about 0.8 of the limit too: they cannot both stay
    kept = limited.kept()
    new = [trajectory for trajectory in kept if trajectory.startswith("new-")]
    assert new == [f"new-{n:04}" for n in range(NEW)]  # every new one, none of them given up for room
    assert limited.rows("new") == NEW * SPANS_EACH  # whole
    old = [trajectory for trajectory in kept if trajectory.startswith("old-")]
    assert len(old) < OLD
    assert old == [f"old-{n:04}" for n in range(OLD - len(old), OLD)]  # what went is the oldest
    assert limited.store.path.stat().st_size <= LIMIT
    assert limited.dropped == []


def test_a_batch_larger_than_the_whole_store_keeps_its_newest_part_and_counts_the_rest(
        limited: Limited, caplog: pytest.LogCaptureFixture) -> None:
    limited.trajectories("old", OLD, payload=12_000)
    with caplog.at_level(logging.WARNING, "toolspan.store"):
        limited.trajectories("new", NEW, payload=3_000)  # about 2.3 times the limit
    kept = limited.kept()
    assert not [trajectory for trajectory in kept if trajectory.startswith("old-")]  # the old went first
    first = NEW - len(kept)
    assert 0 < first < NEW - 100
    assert kept == [f"new-{n:04}" for n in range(first, NEW)]  # the newest part, without a gap
    written = limited.rows("new")
    assert (len(kept) - 1) * SPANS_EACH < written <= len(kept) * SPANS_EACH  # the first one kept may be partial
    assert {reason for reason, _ in limited.dropped} == {names.STORE_DROP_WRITE}
    assert sum(count for _, count in limited.dropped) == NEW * SPANS_EACH - written  # every span: a row or counted
    assert sum("larger than the whole store" in r.getMessage() for r in caplog.records) == 1
    assert limited.store.path.stat().st_size <= LIMIT
    limited.trajectories("after", 10, payload=300)  # and the next batch is written whole
    assert limited.rows("after") == 10 * SPANS_EACH


def test_turns_whose_request_a_batch_too_large_lost_do_not_fill_the_store(limited: Limited) -> None:
    # A request's turns end before it, maybe a batch earlier: they wait in the store for it. When the
    # request is in the oldest part of a batch too large for the store, they wait for good; a store
    # that kept them would fill up with them, and then keep nothing new at all.
    for round_ in range(12):
        with limited.tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                                  attributes={names.ATTR_CONVERSATION_ID: f"held-{round_:02}"}):
            with limited.tracer.start_as_current_span(f"{names.SPAN_CHAT_PREFIX} demo", kind=SpanKind.CLIENT,
                                                      attributes={names.ATTR_INPUT_MESSAGES: "y" * 100_000}):
                pass
            assert limited.store.flush(60.0)  # the turn, written alone, waiting for its request
            assert limited.waiting() == 1, round_  # this one; none of the rounds before
        limited.trajectories(f"r{round_:02}", 150, payload=6_000)  # the request first, in a batch of ~1.3 MiB
        kept = limited.kept()
        assert kept, round_  # the newest part of every batch
        assert all(trajectory.startswith(f"r{round_:02}-") for trajectory in kept), round_
    assert limited.waiting() == 0
    assert all(count > 1 for _, count in limited.dropped)  # only the big batches' oldest parts
