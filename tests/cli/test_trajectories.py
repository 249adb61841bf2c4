"""`toolspan trajectories` (gateway.cli.trajectories): list, show, report, import and export of the
trajectory store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from telemetry import names


def test_trajectories_after_the_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The demo records its trajectory; the report shows its rename, rejection, corrected retry and
    recovery; `show` prints the timeline the demo printed."""
    store = tmp_path / "demo.sqlite3"
    monkeypatch.setenv("TOOLSPAN_TRAJECTORY_STORE_PATH", str(store))
    assert main(["demo"]) == 0
    demo = capsys.readouterr().out
    assert main(["trajectories", "report", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    weather = next(t for t in figures["tools"] if t["tool"] == "get_weather")
    assert weather["renames"] == [{"from": "city_name", "to": "city", "count": 1}]
    assert (weather["rejections"], weather["retries"]["corrected"], weather["recoveries"]) == (1, 1, 1)
    assert figures["overall"]["rejections"] == 1
    # The weather story's trajectory (the hand-back after it is one of its own).
    listed = next(t for t in json.loads(_run_cli(capsys, "trajectories", "list", "--json"))
                  if f"trajectory: {t['id']}" in demo)
    assert f"trajectory: {listed['id']}" in demo
    shown = _run_cli(capsys, "trajectories", "show", listed["id"])
    timeline = [line for line in demo.splitlines() if line.startswith(("model turn", "  tool call", "    "))]
    assert len(timeline) > 8
    assert "\n".join(timeline) in shown
    # Content capture is on in the demo: the question, the model's calls and its final answer.
    assert "    user: What is the weather in Lisbon right now, in Fahrenheit?" in shown
    assert 'assistant: calls get_weather({"city_name": "Lisbon"})' in shown
    final = demo.split("\nassistant: ", 1)[1].splitlines()[0]
    assert shown.rstrip().endswith(f"      assistant: {final}")
    assert "city_name" in _run_cli(capsys, "trajectories", "report")


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_trajectories_export_and_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOOLSPAN_TRAJECTORY_STORE_PATH", str(tmp_path / "a.sqlite3"))
    assert main(["demo"]) == 0
    capsys.readouterr()
    _run_cli(capsys, "trajectories", "export", str(tmp_path / "traces.jsonl"))
    copy = str(tmp_path / "b.sqlite3")
    assert "spans recorded" in _run_cli(capsys, "trajectories", "import", "--db", copy, str(tmp_path / "traces.jsonl"))
    assert _run_cli(capsys, "trajectories", "list", "--db", copy) == _run_cli(capsys, "trajectories", "list")


def test_trajectories_without_a_store_or_trajectory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "list", "--db", str(tmp_path / "none.sqlite3")]) == 2
    assert "no trajectory store at" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()
    assert main(["trajectories", "import", "--db", str(tmp_path / "x.sqlite3"), str(tmp_path / "x.sqlite3")]) == 2
    assert main(["trajectories", "show", "nope", "--db", str(tmp_path / "x.sqlite3")]) == 1


def _otlp_line(attributes: list[dict[str, Any]], **span: Any) -> str:
    call = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "a", "parentSpanId": "0" * 15 + "b", "name": "tool.call",
            "kind": 1, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "t1"}},
                           {"key": "gen_ai.tool.name", "value": {"stringValue": "x"}}, *attributes]} | span
    request = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "b", "name": "POST /v1/chat/completions", "kind": 2,
               "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000002000000000",
               "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "t1"}}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [call, request]}]}]})


@pytest.mark.parametrize(("attribute", "span"), [
    ({"key": "toolspan.args.missing", "value": {"boolValue": True}}, {}),
    ({"key": "toolspan.round", "value": {"intValue": "99999999999999999999"}}, {}),
    ({"key": "toolspan.args.suggestions", "value": {"arrayValue": {"values": [{"intValue": "3"}]}}}, {}),
    ({"key": "toolspan.args.unrecognized",
      "value": {"arrayValue": {"values": [{"arrayValue": {"values": [{"stringValue": "a"}]}}]}}}, {}),
    ({"key": "gen_ai.conversation.id", "value": {"intValue": "7"}}, {}),
    ({"key": "toolspan.outcome", "value": {"stringValue": 5}}, {}),
    (None, {"name": 5}),
    (None, {"endTimeUnixNano": "9" * 30}),
], ids=["bool-names", "huge-round", "int-names", "nested-names", "int-id", "bad-string", "int-name", "huge-time"])
def test_trajectories_import_refuses_attributes_of_the_wrong_type(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], attribute: dict[str, Any] | None,
        span: dict[str, Any]) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(_otlp_line([]) + "\n")
    bad.write_text("\n" + _otlp_line([attribute] if attribute else [], **span) + "\n")
    db = tmp_path / "s.sqlite3"
    assert main(["trajectories", "import", "--db", str(db), str(good)]) == 0
    capsys.readouterr()
    assert main(["trajectories", "import", "--db", str(db), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"toolspan: {bad}: line 2: ")
    assert err.count("\n") == 1
    for command in (["report"], ["list"], ["show", "t1"]):
        assert main(["trajectories", *command, "--db", str(db)]) == 0
    capsys.readouterr()
    [listed] = json.loads(_run_cli(capsys, "trajectories", "list", "--json", "--db", str(db)))
    assert listed["tool_calls"] == 1  # the good file's call, and nothing of the bad one's


def test_trajectories_import_of_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "import", "--db", str(tmp_path / "s.sqlite3"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"toolspan: {tmp_path}: cannot read it")
    assert err.count("\n") == 1


def test_an_unknown_outcome_is_a_usage_error_listing_the_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "list", "--outcome", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --outcome: invalid choice: 'bogus' (choose from " in err
    for outcome in names.OUTCOMES:
        assert f"'{outcome}'" in err


def otlp_line(trajectory: str) -> str:
    """One request span with one tool call under it, as `toolspan trajectories import` reads them."""
    def attributes(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
        return [{"key": key, "value": {"stringValue": value}} for key, value in pairs]

    call = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "a", "parentSpanId": "0" * 15 + "b",
            "name": "tool.call", "kind": 1, "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": attributes(("gen_ai.conversation.id", trajectory), ("gen_ai.tool.name", "x"))}
    request = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "b", "name": "POST /v1/chat/completions",
               "kind": 2, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000002000000000",
               "attributes": attributes(("gen_ai.conversation.id", trajectory))}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [call, request]}]}]})


@pytest.mark.slow  # `toolspan trajectories` as a process, five times
@pytest.mark.parametrize("command", [["export"], ["report"], ["list"], ["list", "--json"], ["show", "t1"]])
def test_output_to_a_reader_that_left_ends_quietly(tmp_path: Path, command: list[str]) -> None:
    """`toolspan trajectories export | head`: the reader is gone before the output ends (here before
    it begins: the pipe's reading end is closed first). No traceback; a shell's status for a
    program SIGPIPE ended."""
    (tmp_path / "one.jsonl").write_text(otlp_line("t1") + "\n")
    store = str(tmp_path / "store.sqlite3")
    assert main(["trajectories", "import", "--db", store, str(tmp_path / "one.jsonl")]) == 0
    reading, writing = os.pipe()
    os.close(reading)
    try:
        done = subprocess.run([sys.executable, "-m", "gateway", "trajectories", *command, "--db", store],
                              stdout=writing, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(writing)
    assert (done.returncode, done.stderr.decode()) == (141, "")
