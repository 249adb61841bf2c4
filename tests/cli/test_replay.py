"""`toolspan trajectories replay` (gateway.cli.replay) on what it cannot replay against: each bad
--against is one line on stderr and exit status 2, never a traceback. The replay's counts, and the
status CI sees from a process of its own, are tests/improve/test_replay.py's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gateway.cli.main import main
from telemetry.store.schema import connect


@pytest.fixture
def empty_store(tmp_path: Path) -> Path:
    path = tmp_path / "empty.sqlite3"
    connect(str(path)).close()
    return path


FILES = {"not-json.json": "{tools: []", "number.json": "42", "empty.json": "[]", "strings.json": '["read_file"]',
         "nameless.json": '[{"type": "function", "function": {"parameters": {}}}]',
         "schema-not-object.json": '{"read_file": "path"}', "latin1.json": b"\xff\xfe[]"}


@pytest.mark.parametrize(("against", "said"), [
    ("no_such_module_of_tools:tools", "cannot import 'no_such_module_of_tools'"),
    ("json:no_such_attribute", "module 'json' has no attribute 'no_such_attribute'"),
    ("json:__name__", "expected a ToolRegistry, a Tool or an iterable of tools, got str"),
    ("plain-word", "give module:attr (tools, as toolspan serve --tools takes them) or a JSON file"),
    ("missing.json", "cannot read it (No such file or directory)"),
    ("not-json.json", "not JSON (Expecting property name enclosed in double quotes"),
    ("number.json", "a JSON int; expected a JSON list of tool declarations"),
    ("empty.json", "declares no tools"),
    ("strings.json", "item 0 declares no tool"),
    ("nameless.json", "item 0 declares no tool"),
    ("schema-not-object.json", "the schema of 'read_file' is a JSON str, not an object"),
    ("latin1.json", "not UTF-8 text"),
])
def test_a_bad_against_is_one_line_and_status_2(empty_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], against: str, said: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path])  # the import puts the current folder first: this test's only
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["trajectories", "replay", "--db", str(empty_store), "--against", against]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("toolspan: --against "), err
    assert err.count("\n") == 1, err
    assert said in err


def test_a_bad_examples_count_is_refused(empty_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "replay", "--db", str(empty_store), "--examples", "-1"])
    assert exited.value.code == 2
    assert "--examples: '-1': give a whole number from 0" in capsys.readouterr().err


def test_an_empty_store_replays_nothing(empty_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "replay", "--db", str(empty_store), "--json", "--fail-on-regression"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["calls"], answer["tools"]) == (0, [])
