"""`toolspan trajectories export --format chat-jsonl` (telemetry.store.dataset) on the two-model
session: every line read back and validated against the dataset's schema, counted against the
session's hand counts, labelled as the session ran, narrowed as `list` narrows, with no secret
under the redact keys; and from a store without captured messages, or of schema version 6."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.demo.model import Reply
from telemetry.store.columns import MODEL_TURNS, TABLES, TOOL_CALLS
from telemetry.store.schema import SCHEMA_VERSION, connect
from tests.conftest import USER, StackFactory
from tests.improve import session as scripted
from tests.improve.conftest import Session, export

TOOLS = ["read_file", "add", "search", "login"]  # as the session's registry offers them


def _call_of(example: dict[str, Any]) -> dict[str, Any]:
    """The call an example is about, as its last message makes it."""
    last = example["messages"][-1]
    assert last["role"] == "assistant"
    wanted = example["source"]["corrected_call_id"] if example["labels"]["example"] == "pair" \
        else example["source"]["call_id"]
    [call] = [call for call in last["tool_calls"] if call["id"] == wanted]
    return call


def _find(examples: list[dict[str, Any]], tool: str, arguments: Any) -> dict[str, Any]:
    [found] = [e for e in examples if e["source"]["tool"] == tool and e["labels"]["arguments"] == arguments]
    return found


def test_one_example_per_call(improve_session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = export(improve_session.path, tmp_path / "calls.jsonl", capsys)
    assert len(examples) == scripted.CALLS
    assert Counter(e["source"]["model"] for e in examples) == scripted.CALLS_BY_MODEL
    for example in examples:
        call = _call_of(example)  # the messages end with the assistant message making the call
        assert call["function"]["name"] == example["source"]["tool"]
        assert example["messages"][0] == {"role": "user", "content": "hello"}
        assert [tool["function"]["name"] for tool in example["tools"]] == TOOLS
        assert example["labels"]["context"] == "captured"
        assert example["labels"]["example"] == "call"
    login = _find(examples, "login", {"user": "ann", "password": "[REDACTED]"})
    assert json.loads(_call_of(login)["function"]["arguments"]) == {"user": "ann", "password": "[REDACTED]"}
    assert login["source"]["key"] == "alpha"
    assert (login["source"]["upstream"], login["labels"]["outcome"]) == ("primary", "ok")


def test_the_labels_say_what_happened(improve_session: Session, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    examples = export(improve_session.path, tmp_path / "calls.jsonl", capsys)
    renamed = _find(examples, "read_file", {"file_path": "/a"})
    assert renamed["labels"] | {"diagnostic": None} == {
        "example": "call", "outcome": "rejected", "rejection_reason": "missing_arguments",
        "error_type": "missing_arguments", "retry_kind": None, "diagnostic": None, "arguments": {"file_path": "/a"},
        "corrected_arguments": {"path": "/a"}, "context": "captured"}
    assert "Unrecognized: file_path (did you mean 'path'?)" in renamed["labels"]["diagnostic"]
    fixed = _find(examples, "read_file", {"path": "/a"})
    assert (fixed["labels"]["outcome"], fixed["labels"]["retry_kind"]) == ("ok", "corrected")
    assert fixed["labels"]["corrected_arguments"] is None
    # The context of the fix: the renamed call, and what the model was told of it.
    assert fixed["messages"][-2] == {"role": "tool", "tool_call_id": renamed["source"]["call_id"],
                                     "content": renamed["labels"]["diagnostic"]}
    typed = _find(examples, "add", {"a": "1", "b": 2})
    assert (typed["labels"]["rejection_reason"], typed["labels"]["corrected_arguments"]) == (
        "schema_violation", {"a": 1, "b": 2})
    # Model B sent its rename twice, verbatim, and never recovered: nothing corrected either.
    stuck = [e for e in examples if e["labels"]["arguments"] == {"filepath": "/b"}]
    assert [e["labels"]["retry_kind"] for e in stuck] == [None, "verbatim"]
    assert [e["labels"]["corrected_arguments"] for e in stuck] == [None, None]
    assert Counter(e["labels"]["outcome"] for e in examples) == {"ok": 7, "rejected": 5}


def test_one_example_per_corrected_failure(improve_session: Session, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pairs = export(improve_session.path, tmp_path / "pairs.jsonl", capsys, "--pairs")
    assert len(pairs) == scripted.CORRECTED_FAILURES
    assert sorted(p["source"]["tool"] for p in pairs) == ["add", "read_file", "search"]
    for pair in pairs:
        labels, messages = pair["labels"], pair["messages"]
        assert (labels["example"], labels["retry_kind"], labels["context"]) == ("pair", "corrected", "captured")
        assert labels["outcome"] == "rejected"
        # the failed call, what the model was told, then the corrected call, last
        failed = messages[-3]["tool_calls"][0]
        assert failed["id"] == pair["source"]["call_id"]
        assert json.loads(failed["function"]["arguments"]) == labels["arguments"]
        assert messages[-2] == {"role": "tool", "tool_call_id": failed["id"], "content": labels["diagnostic"]}
        assert json.loads(_call_of(pair)["function"]["arguments"]) == labels["corrected_arguments"]
    read_file = next(p for p in pairs if p["source"]["tool"] == "read_file")
    assert (read_file["labels"]["arguments"], read_file["labels"]["corrected_arguments"]) == (
        {"file_path": "/a"}, {"path": "/a"})


def _listed(store: Path, capsys: pytest.CaptureFixture[str], *filters: str) -> list[str]:
    assert main(["trajectories", "list", "--db", str(store), "--json", *filters]) == 0
    return [t["id"] for t in json.loads(capsys.readouterr().out)]


# Filters, and the calls they keep, counted by hand from the session (tests.improve.session).
FILTERED = [(["--tool", "add"], 3), (["--outcome", "rejected"], 5), (["--model", scripted.MODEL_B], 6),
            (["--key", "alpha"], 6), (["--limit", "2"], 4),  # the newest two: B's last two, two calls each
            (["--since", "1h"], scripted.CALLS), (["--since", "2999-01-01"], 0),
            (["--tool", "read_file", "--key", "beta"], 3)]


@pytest.mark.parametrize(("filters", "calls"), FILTERED)
def test_the_filters_narrow_as_list_does(improve_session: Session, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str], filters: list[str], calls: int) -> None:
    examples = export(improve_session.path, tmp_path / "some.jsonl", capsys, *filters)
    assert len(examples) == calls
    listed = _listed(improve_session.path, capsys, *filters)
    assert list(dict.fromkeys(e["source"]["trajectory_id"] for e in examples)) == listed
    given = dict(zip(filters[::2], filters[1::2], strict=True))
    assert all(e["source"]["tool"] == given.get("--tool", e["source"]["tool"]) for e in examples)
    assert all(e["labels"]["outcome"] == given.get("--outcome", e["labels"]["outcome"]) for e in examples)
    assert all(e["source"]["model"] == given.get("--model", e["source"]["model"]) for e in examples)
    assert all(e["source"]["key"] == given.get("--key", e["source"]["key"]) for e in examples)


def _copy(session: Session, path: Path, *updates: str) -> Path:
    """A copy of the session's store, changed by `updates`."""
    copy = sqlite3.connect(path, isolation_level=None)
    session.db.backup(copy)
    for update in updates:
        copy.execute(update)
    copy.close()
    return path


UNCAPTURED = "UPDATE model_turns SET input_messages = NULL, output_messages = NULL, tool_definitions = NULL"


def test_without_captured_messages_the_calls_alone(improve_session: Session, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """What the store holds with capture_message_content off: the calls, from their recorded arguments."""
    store = _copy(improve_session, tmp_path / "uncaptured.sqlite3", UNCAPTURED)
    examples = export(store, tmp_path / "calls.jsonl", capsys)
    assert len(examples) == scripted.CALLS
    for example in examples:
        [message] = example["messages"]
        assert json.loads(_call_of(example)["function"]["arguments"]) == example["labels"]["arguments"]
        assert message["content"] is None
        assert (example["tools"], example["labels"]["context"]) == ([], "not_captured")
    renamed = _find(examples, "read_file", {"file_path": "/a"})
    assert renamed["labels"]["corrected_arguments"] == {"path": "/a"}
    assert renamed["source"]["model"] == scripted.MODEL_A  # its turn, found by its round
    pairs = export(store, tmp_path / "pairs.jsonl", capsys, "--pairs")
    assert len(pairs) == scripted.CORRECTED_FAILURES
    for pair in pairs:
        failed, told, corrected = pair["messages"]
        assert told == {"role": "tool", "tool_call_id": failed["tool_calls"][0]["id"],
                        "content": pair["labels"]["diagnostic"]}
        assert json.loads(corrected["tool_calls"][0]["function"]["arguments"]) == pair["labels"]["corrected_arguments"]


def test_a_call_with_nothing_recorded_is_left_out_and_counted(improve_session: Session, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Capture off and arguments recorded on rejections only (the defaults): the ok calls cannot be shown."""
    store = _copy(improve_session, tmp_path / "defaults.sqlite3", UNCAPTURED,
                  "UPDATE tool_calls SET arguments = NULL WHERE outcome = 'ok'")
    out = tmp_path / "calls.jsonl"
    assert main(["trajectories", "export", "--db", str(store), "--format", "chat-jsonl", str(out)]) == 0
    rejected = 5
    assert capsys.readouterr().err == (f"{out}: {rejected} examples written ({scripted.CALLS - rejected} calls "
                                       "left out: neither messages nor arguments recorded)\n")
    assert len(out.read_text().splitlines()) == rejected


TERMINAL = "\x1b[2J\x7f\x9b\u202eé"  # what a terminal would act on: escaped in the file


def test_secrets_the_spans_kept_are_masked_on_the_way_out(improve_session: Session, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A store written with fewer redact keys (or imported) holds a secret: the export masks it
    again. And whatever a message holds, the file is printable ASCII."""
    raw = json.dumps({"user": "ann", "password": scripted.SECRET})
    said = json.dumps([{"role": "user", "parts": [
        {"type": "text", "content": f'my "api_key": "{scripted.SECRET}"'}, {"type": "text", "content": TERMINAL}]}])
    offered = json.dumps([{"type": "function", "name": "login", "parameters": {
        "type": "object", "properties": {"password": {"type": "string", "default": scripted.SECRET}}}}])
    store = _copy(improve_session, tmp_path / "leaky.sqlite3",
                  f"UPDATE tool_calls SET arguments = '{raw}' WHERE tool = 'login'",
                  f"UPDATE model_turns SET input_messages = '{said}', tool_definitions = '{offered}'")
    examples = export(store, tmp_path / "calls.jsonl", capsys)  # SECRET appears nowhere in the file
    login = next(e for e in examples if e["source"]["tool"] == "login")
    assert login["labels"]["arguments"] == {"user": "ann", "password": "[REDACTED]"}
    assert login["messages"][0]["content"] == f'my "api_key": "[REDACTED]"\n{TERMINAL}'
    text = (tmp_path / "calls.jsonl").read_text(encoding="utf-8")
    assert all(" " <= ch <= "~" for ch in text.replace("\n", ""))  # safe on a terminal: printable ASCII
    assert login["tools"][0]["function"]["parameters"]["properties"]["password"] == {
        "type": "string", "default": "[REDACTED]"}


def test_a_store_of_schema_6(improve_session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written before the turns kept their tools: every command reads it as it is, as this version's
    tables (the columns it lacks empty) and leaves the file alone; the gateway, opening it, migrates it."""
    path = tmp_path / "v6.sqlite3"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript("\n".join(table.create(6) for table in TABLES))
    old.execute("ATTACH DATABASE ? AS new", (str(improve_session.path),))
    for table in TABLES:
        columns = ", ".join(column.name for column in table.columns if column.since <= 6)
        old.execute(f"INSERT INTO {table.name} SELECT {columns} FROM new.{table.name}")
    old.executescript("DETACH DATABASE new; PRAGMA user_version = 6;")
    old.close()
    for command in (["report", "--by", "model"], ["list"], ["replay"]):  # each reads version 7's columns
        assert main(["trajectories", *command, "--db", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (6,)  # read, not changed
    examples = export(path, tmp_path / "v6.jsonl", capsys)
    assert len(examples) == scripted.CALLS
    assert all(e["tools"] == [] and e["labels"]["context"] == "captured" for e in examples)
    # and as OTLP, as before
    assert main(["trajectories", "export", "--db", str(path), str(tmp_path / "v6.otlp.jsonl")]) == 0
    assert capsys.readouterr().err.endswith(" spans written\n")
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (6,)
    migrated = connect(str(path))
    assert migrated.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    columns = [row[1] for row in migrated.execute("PRAGMA table_info(model_turns)")]
    assert columns == list(MODEL_TURNS.names)
    assert columns[-1] == "tool_definitions"
    assert set(migrated.execute("SELECT tool_definitions FROM model_turns")) == {(None,)}
    migrated.close()
    assert len(export(path, tmp_path / "v7.jsonl", capsys)) == scripted.CALLS
    assert TOOL_CALLS.names == tuple(row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(tool_calls)"))


def test_an_option_of_the_dataset_alone_is_one_line(improve_session: Session,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "export", "--db", str(improve_session.path), "--tool", "add", "--key", "beta",
                 "--pairs"]) == 2
    assert capsys.readouterr().err == ("toolspan: --tool, --key, --pairs: only with --format chat-jsonl (an OTLP "
                                       "export is the whole store)\n")


@pytest.mark.parametrize(("options", "said"), [
    (["--format", "chat-jsonl", "--limit", "0"], "'0': give a whole number from 1"),
    (["--format", "chat-jsonl", "--pairs=yes"], "ignored explicit argument 'yes'"),
    (["--format", "jsonl"], "invalid choice: 'jsonl'"),
])
def test_bad_options_are_a_usage_error(improve_session: Session, capsys: pytest.CaptureFixture[str],
                                       options: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "export", "--db", str(improve_session.path), *options])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err.splitlines()[-1]
    assert "Traceback" not in err


def test_a_file_it_cannot_write_is_one_line(improve_session: Session, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "export", "--db", str(improve_session.path), "--format", "chat-jsonl",
                 str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"toolspan: {tmp_path}: cannot write it")


def test_without_a_file_the_lines_go_to_stdout(improve_session: Session, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "export", "--db", str(improve_session.path), "--format", "chat-jsonl",
                 "--pairs"]) == 0
    out, err = capsys.readouterr()
    assert err == f"stdout: {scripted.CORRECTED_FAILURES} examples written\n"
    file = tmp_path / "pairs.jsonl"
    assert [json.loads(line) for line in out.splitlines()] == export(improve_session.path, file, capsys, "--pairs")


# Nested far deeper than the gateway takes (gateway.tools.arguments.MAX_ARGUMENT_DEPTH): rejected, and
# recorded in full, as the model sent it.
DEEP = '{"a": ' + "[" * 600 + "]" * 600 + "}"


async def test_arguments_nested_too_deep_are_kept_as_text(make_stack: StackFactory, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    stack = await make_stack(capture_message_content=True, record_tool_arguments=True)
    stack.script.then(Reply(tool_calls=[("read_file", json.loads(DEEP))]), Reply(content="done"))
    answer = await stack.client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "done"
    await stack.store.flushed()
    store = stack.store.path
    [example] = export(store, tmp_path / "deep.jsonl", capsys)  # valid against the dataset's schema
    assert example["labels"]["rejection_reason"] == "invalid_json"
    assert example["labels"]["arguments"] == DEEP
    assert _call_of(example)["function"]["arguments"] == DEEP
    [listed] = json.loads(_run_cli(capsys, "list", "--db", str(store), "--json"))
    shown = _run_cli(capsys, "show", listed["id"], "--db", str(store))
    assert DEEP[:40] in shown
    assert json.loads(_run_cli(capsys, "report", "--db", str(store), "--json"))["tools"]
    assert main(["trajectories", "export", "--db", str(store), str(tmp_path / "deep.otlp.jsonl")]) == 0
    capsys.readouterr()
    # As another writer may have stored them: the captured answer's arguments decoded, and a column
    # nested deeper than the interpreter's stack can decode.
    call = {"type": "tool_call", "id": example["source"]["call_id"], "name": "read_file", "arguments": json.loads(DEEP)}
    answered = json.dumps([{"role": "assistant", "parts": [call]}])
    beyond = "[" * 100_000 + "]" * 100_000
    written = sqlite3.connect(store)
    written.execute("UPDATE model_turns SET output_messages = ?, input_messages = ?", (answered, beyond))
    written.commit()
    written.close()
    [again] = export(store, tmp_path / "again.jsonl", capsys)
    assert (again["labels"]["arguments"], again["labels"]["context"]) == (DEEP, "not_captured")
    assert _run_cli(capsys, "show", listed["id"], "--db", str(store))


def _run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["trajectories", *args]) == 0
    return capsys.readouterr().out
