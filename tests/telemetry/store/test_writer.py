"""The trajectory store records what the spans say, stays within its bounds, and never fails a
request when its file cannot be written."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from telemetry import names
from telemetry.store.records import prune, write
from telemetry.store.schema import SCHEMA, connect, wal_kept_bytes
from telemetry.store.span_records import SpanRecord
from telemetry.store.writer import TrajectoryStore
from tests.conftest import USER, Stack, StackFactory
from tests.telemetry.conftest import STORED_ACROSS, Session, attr, hex_id, stored_trajectory


def _rows(db: sqlite3.Connection, table: str) -> dict[str, dict[str, Any]]:
    cursor = db.execute(f"SELECT * FROM {table}")
    columns = [c[0] for c in cursor.description]
    return {row[0]: dict(zip(columns, row, strict=True)) for row in cursor}


_LISTED = ("missing", "unrecognized", "suggestions")  # stored as JSON arrays, compared as json.dumps writes them


def _listed(value: Any) -> str | None:
    return json.dumps(list(value)) if value else None


def _expected_call(span: ReadableSpan) -> dict[str, Any]:
    link = next(iter(span.links), None)
    return {"trace_id": hex_id(span.context.trace_id, 32), "request_span_id": hex_id(span.parent.span_id),  # type: ignore[union-attr]
            "trajectory_id": stored_trajectory(span), "round": attr(span, names.ATTR_ROUND),
            "tool": attr(span, names.ATTR_TOOL_NAME), "call_id": attr(span, names.ATTR_TOOL_CALL_ID),
            "outcome": attr(span, names.ATTR_OUTCOME), "rejection_reason": attr(span, names.ATTR_REJECTION_REASON),
            "error_type": attr(span, names.ATTR_ERROR_TYPE), "missing": _listed(attr(span, names.ATTR_ARGS_MISSING)),
            "unrecognized": _listed(attr(span, names.ATTR_ARGS_UNRECOGNIZED)),
            "suggestions": _listed(attr(span, names.ATTR_ARGS_SUGGESTIONS)),
            "retry_kind": attr(span, names.ATTR_RETRY_KIND),
            "retries_span_id": hex_id(link.context.span_id) if link else None,
            "diagnostic": attr(span, names.ATTR_TOOL_CALL_RESULT) if span.status.description else None,
            "arguments": attr(span, names.ATTR_TOOL_CALL_ARGUMENTS),
            "guardrail": attr(span, names.ATTR_GUARDRAIL_NAME),
            "guardrail_decision": attr(span, names.ATTR_GUARDRAIL_DECISION),
            "guardrail_reason": attr(span, names.ATTR_GUARDRAIL_REASON),
            "guardrail_moment": attr(span, names.ATTR_GUARDRAIL_MOMENT),
            "started": (span.start_time or 0) / 1e9,
            "duration_ms": ((span.end_time or 0) - (span.start_time or 0)) / 1e6}


def test_every_tool_call_is_stored_as_its_span_says(session: Session) -> None:
    rows = _rows(session.db, "tool_calls")
    spans = session.tool_spans()
    assert len(spans) == 17
    assert set(rows) == {hex_id(s.context.span_id) for s in spans}
    for span in spans:
        row = rows[hex_id(span.context.span_id)]
        expected = _expected_call(span)
        stored = {k: _listed(json.loads(row[k])) if k in _LISTED and row[k] is not None else row[k] for k in expected}
        assert stored == pytest.approx(expected)
    outcomes = {row["outcome"] for row in rows.values()}
    assert outcomes == {"ok", "rejected", "error", "timeout", "interrupted"}
    assert {row["rejection_reason"] for row in rows.values()} == set(names.REJECTION_REASONS) | {None}
    assert {row["retry_kind"] for row in rows.values()} == {"verbatim", "corrected", None}
    assert {row["guardrail_decision"] for row in rows.values()} == {"deny", "mask", None}


def test_failed_calls_keep_their_masked_arguments(session: Session) -> None:
    rows = list(_rows(session.db, "tool_calls").values())
    [renamed] = [r for r in rows if r["rejection_reason"] == "missing_arguments" and r["tool"] == "read_file"]
    assert json.loads(renamed["arguments"]) == {"file_path": "/a"}
    assert json.loads(renamed["suggestions"]) == ["file_path->path"]
    assert all("hunter22" not in (r["arguments"] or "") + (r["diagnostic"] or "") for r in rows)


def test_model_turns_and_requests_are_stored_as_their_spans_say(session: Session) -> None:
    turns, requests = _rows(session.db, "model_turns"), _rows(session.db, "requests")
    chats = [s for s in session.spans() if s.kind is SpanKind.CLIENT]
    assert set(turns) == {hex_id(s.context.span_id) for s in chats}
    for span in chats:
        row = turns[hex_id(span.context.span_id)]
        assert (row["model"], row["input_tokens"], row["output_tokens"], json.loads(row["finish_reasons"])) == (
            attr(span, names.ATTR_REQUEST_MODEL), attr(span, names.ATTR_INPUT_TOKENS),
            attr(span, names.ATTR_OUTPUT_TOKENS), list(attr(span, names.ATTR_FINISH_REASONS)))
        assert row["request_span_id"] == hex_id(span.parent.span_id)  # type: ignore[union-attr]
    servers = [s for s in session.spans() if s.kind is SpanKind.SERVER]
    assert set(requests) == {hex_id(s.context.span_id) for s in servers}
    for span in servers:
        row = requests[hex_id(span.context.span_id)]
        assert (row["trajectory_id"], row["status"], row["rounds"]) == (
            stored_trajectory(span), attr(span, names.ATTR_HTTP_STATUS), attr(span, names.ATTR_ROUNDS))
    # Each turn's round is its place in the request, as the tool calls number theirs.
    rounds = sorted(r["round"] for r in turns.values() if r["request_span_id"] == hex_id(servers[0].context.span_id))
    assert rounds == list(range(1, 7))


def test_a_trajectory_spans_requests_and_its_retry_links_across_them(session: Session) -> None:
    trajectories = _rows(session.db, "trajectories")
    assert len(trajectories) == 2
    assert STORED_ACROSS in trajectories
    calls = [r for r in _rows(session.db, "tool_calls").values() if r["trajectory_id"] == STORED_ACROSS]
    first, retry = sorted(calls, key=lambda r: r["started"])
    assert first["request_span_id"] != retry["request_span_id"]
    assert (retry["retry_kind"], retry["retries_span_id"], retry["outcome"]) == ("corrected", first["span_id"], "ok")


async def test_health_checks_and_scrapes_are_no_trajectory(stack: Stack) -> None:
    for path in ("/healthz", "/metrics", "/v1/tools"):
        async with stack.http.get(path) as response:
            assert response.status == 200
    await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (0,)


async def test_the_store_is_off_by_a_setting(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack(trajectory_store=False, trajectory_store_path=tmp_path / "off.sqlite3")
    stack.script.then(Reply(content="hi"))
    await stack.ask(False, messages=USER)
    assert stack.observability.store is None
    assert not (tmp_path / "off.sqlite3").exists()


def test_the_default_path_is_in_the_users_data_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert Settings().store_path() == tmp_path / "toolspan" / "trajectories.sqlite3"
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings().store_path() == tmp_path / "home" / ".local" / "share" / "toolspan" / "trajectories.sqlite3"
    monkeypatch.setenv("TOOLSPAN_TRAJECTORY_STORE_PATH", str(tmp_path / "here.db"))
    assert Settings().store_path() == tmp_path / "here.db"


# --- bounds --------------------------------------------------------------------------------------------

def _trajectory(db: sqlite3.Connection, number: int, ended: float, payload: str = "") -> None:
    trace, request = f"{number:032x}", f"{number:016x}"
    start = int(ended * 1e9)
    write(db, [SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, trace, f"{number + 2**40:016x}", request, start,
                          start + 1000, {names.ATTR_TOOL_NAME: "t", names.ATTR_CONVERSATION_ID: f"traj-{number}",
                                         names.ATTR_OUTCOME: "rejected", names.ATTR_TOOL_CALL_ARGUMENTS: payload}),
               SpanRecord("POST /v1/chat/completions", SpanKind.SERVER, trace, request, None, start, start + 2000,
                          {names.ATTR_CONVERSATION_ID: f"traj-{number}"})])


def test_prune_deletes_by_age_and_then_the_oldest_first() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    for number in range(6):
        _trajectory(db, number, ended=1000.0 + number)
    assert prune(db, before=1002.0, oldest=2) == 4
    assert [row[0] for row in db.execute("SELECT id FROM trajectories ORDER BY id")] == ["traj-4", "traj-5"]
    assert db.execute("SELECT COUNT(*) FROM tool_calls").fetchone() == (2,)
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (2,)


async def test_old_trajectories_age_out(make_stack: StackFactory) -> None:
    stack = await make_stack(trajectory_store_max_age_days=1)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1})]), Reply(content="x"))
    await stack.ask(False, messages=USER)
    await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    _trajectory(db, 1, ended=1.0)  # written in 1970: older than a day
    db.commit()
    stack.script.then(Reply(content="y"))
    await stack.ask(False, messages=USER)
    await stack.store.flushed()
    assert "traj-1" not in {row[0] for row in db.execute("SELECT id FROM trajectories")}
    assert db.execute("SELECT COUNT(*) FROM trajectories").fetchone() == (2,)  # the two requests' own


async def test_the_size_limit_keeps_the_newest_trajectories(make_stack: StackFactory) -> None:
    limit = 256 * 1024
    stack = await make_stack(trajectory_store_max_bytes=limit, argument_max_chars=8000)
    for number in range(40):  # ~8 KB of arguments each: well past the limit in all
        stack.script.then(Reply(tool_calls=[("add", {"a": number, "pad": "x" * 8000})]), Reply(content="x"))
        await stack.ask(False, messages=USER, extra_headers={"X-Trajectory-Id": f"t{number:02}"})
        await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    kept = sorted(row[0] for row in db.execute("SELECT id FROM trajectories"))
    assert 3 < len(kept) < 40
    assert kept[-1] == "t39"
    assert kept == [f"t{n:02}" for n in range(40 - len(kept), 40)]
    assert stack.store.path.stat().st_size <= limit
    assert stack.metric(names.METRIC_TRAJECTORY_STORE_DROPPED, reason=names.STORE_DROP_WRITE) == 0


# --- faults: requests go on, the loss is counted --------------------------------------------------

async def _serve_one(stack: Stack, trajectory: str) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1})]), Reply(content="fine"))
    answer = await stack.ask(False, messages=USER, extra_headers={"X-Trajectory-Id": trajectory})
    assert answer.content == "fine"
    await stack.store.flushed()


def _dropped(stack: Stack) -> float:
    return stack.metric(names.METRIC_TRAJECTORY_STORE_DROPPED, reason=names.STORE_DROP_WRITE)


async def test_a_read_only_file_drops_and_counts(make_stack: StackFactory, caplog: pytest.LogCaptureFixture) -> None:
    stack = await make_stack()
    await _serve_one(stack, "before")
    stack.store.path.chmod(0o444)
    await _serve_one(stack, "during-1")
    await _serve_one(stack, "during-2")
    # Two requests of two model turns and a tool call each (and the request, counted when it came
    # in the same batch as one of those: the span that ends last may come alone).
    assert 6 <= _dropped(stack) <= 8
    assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1  # logged once
    stack.store.path.chmod(0o644)
    await _serve_one(stack, "after")
    ids = {row[0] for row in sqlite3.connect(stack.store.path).execute("SELECT id FROM trajectories")}
    assert ids == {"before", "after"}


async def test_a_deleted_file_is_created_again(make_stack: StackFactory) -> None:
    stack = await make_stack()
    await _serve_one(stack, "before")
    stack.store.path.unlink()
    await _serve_one(stack, "after")
    ids = {row[0] for row in sqlite3.connect(stack.store.path).execute("SELECT id FROM trajectories")}
    assert ids == {"after"}
    assert _dropped(stack) == 0


async def test_a_vanished_directory_drops_and_counts(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack(trajectory_store_path=tmp_path / "gone" / "store.sqlite3")
    await _serve_one(stack, "before")
    shutil.rmtree(tmp_path / "gone")
    (tmp_path / "gone").write_text("a file where the directory was")  # so it cannot be made again
    await _serve_one(stack, "during")
    assert _dropped(stack) > 0


async def test_a_full_disk_drops_and_counts(make_stack: StackFactory) -> None:
    # The store's size cap is SQLite's max_page_count: past it, writes fail as on a full disk. One
    # call whose arguments alone exceed the whole file can never be written, even with the rest pruned.
    stack = await make_stack(trajectory_store_max_bytes=128 * 1024, argument_max_chars=200_000)
    await _serve_one(stack, "small")
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "pad": "x" * 150_000})]), Reply(content="fine"))
    answer = await stack.ask(False, messages=USER, extra_headers={"X-Trajectory-Id": "huge"})
    assert answer.content == "fine"
    await stack.store.flushed()
    assert _dropped(stack) > 0
    await _serve_one(stack, "after")  # and it writes again once there is room
    db = sqlite3.connect(stack.store.path)
    assert "after" in {row[0] for row in db.execute("SELECT id FROM trajectories")}
    assert db.execute("SELECT COUNT(*) FROM tool_calls WHERE trajectory_id = 'huge'").fetchone() == (0,)


async def test_a_token_count_past_64_bits_is_clamped_and_the_writer_goes_on(make_stack: StackFactory) -> None:
    stack = await make_stack()
    stack.script.then(Reply(content="a", usage=(2**63, 5)))
    await stack.ask(False, messages=USER, extra_headers={"X-Trajectory-Id": "huge"})
    await _serve_one(stack, "after")
    db = sqlite3.connect(stack.store.path)
    assert {row[0] for row in db.execute("SELECT id FROM trajectories")} == {"huge", "after"}
    assert db.execute("SELECT MAX(input_tokens) FROM model_turns").fetchone() == (2**63 - 1,)
    assert _dropped(stack) == 0


async def test_an_unexpected_error_drops_the_batch_and_the_writer_goes_on(
        make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stack = await make_stack()
    broken = [True]

    def write_once_broken(db: sqlite3.Connection, records: Any) -> int:
        if broken.pop() if broken else False:
            raise RuntimeError("a bug")
        return write(db, records)

    monkeypatch.setattr("telemetry.store.writer.write", write_once_broken)
    await _serve_one(stack, "lost")
    assert _dropped(stack) > 0
    assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1
    await _serve_one(stack, "after")
    ids = {row[0] for row in sqlite3.connect(stack.store.path).execute("SELECT id FROM trajectories")}
    assert "after" in ids


def test_a_span_that_cannot_be_read_is_dropped_and_counted_and_its_end_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dropped: list[tuple[str, int]] = []
    store = TrajectoryStore(tmp_path / "s.sqlite3", dropped=lambda reason, count: dropped.append((reason, count)))
    try:
        store.on_end(ReadableSpan(name=names.SPAN_TOOL_CALL))  # no context: no ids to record it by
        assert dropped == [(names.STORE_DROP_WRITE, 1)]
        assert "could not be read" in caplog.text
        assert store.flush(10.0)
    finally:
        store.shutdown()


def test_a_checkpoint_cuts_the_write_ahead_log_back(tmp_path: Path) -> None:
    # Between checkpoints the log grows to wal_autocheckpoint's 8000 pages (~32 MiB); each one
    # cuts it back to a quarter of a store this small.
    max_bytes = 2**20
    db = connect(str(tmp_path / "s.sqlite3"), max_bytes)
    wal = tmp_path / "s.sqlite3-wal"
    sizes = [0]
    for number in range(5000):
        db.execute("BEGIN")
        write(db, [SpanRecord(names.SPAN_TOOL_CALL, SpanKind.INTERNAL, "0" * 32, f"{span:016x}", "1" * 16, 0, 1,
                              {names.ATTR_TOOL_NAME: "t", names.ATTR_TOOL_CALL_ARGUMENTS: str(number) * 2000})
                   for span in range(4)])
        db.execute("COMMIT")
        sizes.append(wal.stat().st_size)
        if sizes[-1] < sizes[-2]:
            break
    assert sizes[-1] < sizes[-2], f"the log never shrank: {max(sizes)} bytes"
    assert max(sizes) <= 33 * 2**20
    assert sizes[-1] <= wal_kept_bytes(max_bytes) == max_bytes // 4
    assert (tmp_path / "s.sqlite3").stat().st_size <= max_bytes
