"""A long trajectory a page at a time: `telemetry.store.report.trajectory` reads a page of requests in a
few statements however long the trajectory is, the pages add up to the whole trajectory, retry
links cross pages, another key sees none of it, `toolspan trajectories show` pages with --page and
--limit, and a store written before the request indexes gets them when it is opened."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from gateway.cli.main import main
from telemetry.store import report
from telemetry.store.reader import StoreReader
from telemetry.store.records import stored_id
from telemetry.store.schema import connect
from tests.conftest import TEST_KEY, Stack, StackFactory, grow_trajectory

BOB_KEY = "sk-bob-key-0000"
KEYS = {"alice": {"key": TEST_KEY}, "bob": {"key": BOB_KEY}}
LONG = "long-run"  # the X-Trajectory-Id both keys send


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    return await make_stack(keys=KEYS)


def _reader(stack: Stack) -> StoreReader:
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    return reader


def _page(reader: StoreReader, offset: int) -> dict[str, Any]:
    found = reader.trajectory(LONG, "alice", offset=offset, limit=5)
    assert found is not None
    return found


def _calls(found: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for r in found["requests"] for e in r["events"] if e["type"] == "tool_call"]


async def test_the_pages_of_a_trajectory_add_up_to_it(keyed: Stack) -> None:
    alice = await grow_trajectory(keyed, LONG, 12, failing_at=5)
    bob = await grow_trajectory(keyed, LONG, 2, key=BOB_KEY)
    reader = _reader(keyed)
    whole = reader.trajectory(LONG, "alice")
    assert whole is not None
    assert [r["trace_id"] for r in whole["requests"]] == alice
    pages = [_page(reader, offset) for offset in (0, 5, 10)]
    assert [[r["index"] for r in p["requests"]] for p in pages] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12]]
    assert [r for p in pages for r in p["requests"]] == whole["requests"]
    for found in (whole, *pages):
        assert found["totals"] == {"requests": 12, "model_turns": 24, "tool_calls": 12, "failed_calls": 1}

    # Request 5's rejected call is retried, corrected, by request 6's: on the next page, both ways.
    failed, retry = _calls(pages[0])[-1], _calls(pages[1])[0]
    assert (failed["outcome"], retry["retry_kind"]) == ("rejected", "corrected")
    assert failed["retried_by"] == {"span_id": retry["span_id"], "request": 6}
    assert (retry["retries_span_id"], retry["retries_request"]) == (failed["span_id"], 5)

    mine = reader.trajectory(LONG, "bob", limit=5)
    assert mine is not None
    assert [r["trace_id"] for r in mine["requests"]] == bob
    assert mine["totals"]["requests"] == 2
    assert reader.trajectory(stored_id("alice", LONG), "bob", offset=5, limit=5) is None
    for wrong in ({"offset": -1}, {"limit": 0}):
        with pytest.raises(ValueError, match="a page starts at 0"):
            reader.trajectory(LONG, "alice", **wrong)


async def test_a_page_is_read_in_a_few_statements_however_long_the_trajectory(keyed: Stack) -> None:
    """Two statements a request (its turns, its calls), each reading the whole trajectory's rows,
    made a trajectory of 2,000 requests take seconds to show."""
    await grow_trajectory(keyed, LONG, 30, failing_at=10)
    db = sqlite3.connect(keyed.store.path)
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    found = report.trajectory(db, LONG, "alice")
    db.set_trace_callback(None)
    assert found is not None
    assert len(found["requests"]) == 30
    assert len(statements) <= 10, statements
    plan = db.execute("EXPLAIN QUERY PLAN SELECT * FROM tool_calls WHERE trajectory_id = ? AND request_span_id = ?",
                      ("alice~x", "y")).fetchall()
    assert "tool_calls_of_request" in str(plan)
    db.close()


async def test_the_cli_shows_a_page_and_how_to_see_more(keyed: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    await grow_trajectory(keyed, LONG, 12)
    await grow_trajectory(keyed, LONG, 2, key=BOB_KEY)
    show = ["trajectories", "show", "--db", str(keyed.store.path), "--key", "alice", LONG, "--limit", "5"]
    assert main(show) == 0
    first = capsys.readouterr().out
    assert first.count("\nrequest ") == 5
    assert "showing requests 1-5 of 12" in first.splitlines()[1]
    assert first.rstrip().endswith("showing requests 1-5 of 12 (page 1 of 3): --page 2 shows the next 5; "
                                   "--limit N shows N a page")
    assert main([*show, "--page", "3"]) == 0
    last = capsys.readouterr().out
    assert last.count("\nrequest ") == 2
    assert "showing requests 11-12 of 12 (page 3 of 3): --page 1 shows the first 5" in last
    assert main([*show, "--page", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in shown["requests"]] == [6, 7, 8, 9, 10]
    assert (shown["offset"], shown["totals"]["requests"]) == (5, 12)

    assert main([*show, "--page", "4"]) == 1
    assert "--page 4 is past the last page of trajectory 'long-run': 3 (12 requests, 5 a page)" in \
        capsys.readouterr().err
    for bad in (["--page", "0"], ["--limit", "-3"], ["--page", "two"]):
        with pytest.raises(SystemExit) as exited:
            main([*show, *bad])
        assert exited.value.code == 2
        assert "give a whole number from 1" in capsys.readouterr().err

    # bob's trajectory of the same id: his two requests, on one page, and no word of alice's.
    assert main(["trajectories", "show", "--db", str(keyed.store.path), "--key", "bob", LONG, "--limit", "5"]) == 0
    his = capsys.readouterr().out
    assert his.count("\nrequest ") == 2
    assert "showing requests" not in his
    assert main(["trajectories", "show", "--db", str(keyed.store.path), "--key", "bob", stored_id("alice", LONG)]) == 1


def test_a_store_written_before_the_request_indexes_gets_them(tmp_path: Any) -> None:
    path = str(tmp_path / "older.sqlite3")
    older = connect(path)
    older.execute("INSERT INTO requests VALUES ('s', 't', 'a~x', 'POST', '/v1', 200, 1, 0, NULL, 1.0, 2.0)")
    for index in ("model_turns_of_request", "tool_calls_of_request"):
        older.execute(f"DROP INDEX {index}")
    older.close()
    opened = connect(path)
    indexes = {row[0] for row in opened.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"model_turns_of_request", "tool_calls_of_request"} <= indexes
    assert opened.execute("SELECT span_id FROM requests").fetchall() == [("s",)]
    opened.close()
