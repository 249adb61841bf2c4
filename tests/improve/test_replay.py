"""`toolspan trajectories replay` on the two-model session (tests.improve.session): the recorded
calls parsed again against a changed tool file give the counts counted by hand
(tests.improve.changed_tools), --fail-on-regression fails when a recorded pass would break and
not against the tools as they were, the filters narrow the calls, no tool body runs, and the calls
of a client's own tools replay against a schema file."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from gateway.cli.main import main
from gateway.demo.model import Reply
from tests.conftest import USER
from tests.improve import session as scripted
from tests.improve.changed_tools import CHANGED, CHANGED_BETA, UNCHANGED_TOTALS
from tests.improve.conftest import Session, ToolFile

COUNTS = ("calls", "fixed", "broken", "still_passing", "still_rejected", "uncertain")


async def replay_cli(capsys: pytest.CaptureFixture[str], session: Session, *options: str) -> tuple[int, str, str]:
    """`toolspan trajectories replay --db <the session's store> OPTIONS` in this process (on a thread:
    the command runs its own event loop); its status, stdout and stderr."""
    status = await asyncio.to_thread(main, ["trajectories", "replay", "--db", str(session.path), *options])
    out, err = capsys.readouterr()
    return status, out, err


def per_tool(answer: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {tool["tool"]: {name: tool[name] for name in COUNTS} for tool in answer["tools"]}


async def test_a_changed_tool_file_gives_the_hand_counts_and_runs_no_body(
        improve_session: Session, tool_file: ToolFile, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = await replay_cli(capsys, improve_session, "--json", "--against", f"{tool_file.module}:tools")
    assert status == 0  # without --fail-on-regression a regression is reported, not failed on
    answer = json.loads(out)
    assert per_tool(answer) == CHANGED
    assert {name: answer[name] for name in COUNTS} == {
        "calls": scripted.CALLS, "fixed": 3, "broken": 2, "still_passing": 4, "still_rejected": 2, "uncertain": 1}
    assert answer["replayed"] == scripted.CALLS
    assert answer["not_replayed"] == {}
    add = next(tool for tool in answer["tools"] if tool["tool"] == "add")
    assert answer["tools"][0] is not None
    assert answer["tools"][0]["tool"] == "add"
    broken = add["broken_examples"]
    assert sorted(json.loads(example["arguments"])["a"] for example in broken) == [1, 2]
    assert {example["recorded_outcome"] for example in broken} == {"ok"}
    assert {example["now_reason"] for example in broken} == {"missing_arguments"}
    assert all("c" in example["now_message"] and "add" in example["now_message"] for example in broken)
    assert {example["key"] for example in broken} == {"alpha", "beta"}
    fixed = next(tool for tool in answer["tools"] if tool["tool"] == "read_file")["fixed_examples"]
    assert sorted(example["recorded_reason"] for example in fixed) == ["missing_arguments"] * 3
    assert {example["now_reason"] for example in fixed} == {None}
    assert not tool_file.ran.exists()  # every body notes it ran: none did


async def test_fail_on_regression_fails_on_a_breaking_change_only(
        improve_session: Session, tool_file: ToolFile, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = await replay_cli(capsys, improve_session, "--against", f"{tool_file.module}:tools",
                                        "--fail-on-regression")
    assert status == 1
    assert err == "toolspan: 2 recorded passes would now be rejected (--fail-on-regression)\n"
    assert "  3 recorded rejections would now pass (fixed)" in out
    assert "  2 recorded passes would now be rejected (broken)" in out
    assert "  add: 3 calls, 3 replayed: 2 broken, 1 still rejected" in out
    assert "  read_file: 6 calls, 6 replayed: 3 fixed, 3 still pass" in out
    assert "  login: 1 call, 1 replayed: 1 uncertain (a masked value)" in out
    assert "    broken: " in out
    assert "recorded ok, now rejected (missing_arguments)" in out
    status, out, err = await replay_cli(capsys, improve_session, "--json", "--against",
                                        f"{tool_file.module}:unchanged", "--fail-on-regression")
    assert (status, err) == (0, "")
    answer = json.loads(out)
    assert {name: answer[name] for name in ("replayed", *COUNTS)} == UNCHANGED_TOTALS
    assert not tool_file.ran.exists()


async def test_the_filters_narrow_the_calls_replayed(improve_session: Session, tool_file: ToolFile,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    against = ("--json", "--against", f"{tool_file.module}:tools")
    _, out, _ = await replay_cli(capsys, improve_session, *against, "--key", "beta")
    assert per_tool(json.loads(out)) == CHANGED_BETA
    _, out, _ = await replay_cli(capsys, improve_session, *against, "--tool", "add")
    assert per_tool(json.loads(out)) == {"add": CHANGED["add"]}
    _, out, _ = await replay_cli(capsys, improve_session, *against, "--since", "1h")
    assert json.loads(out)["calls"] == scripted.CALLS
    _, out, _ = await replay_cli(capsys, improve_session, *against, "--since", "2999-01-01")
    assert json.loads(out)["calls"] == 0
    _, out, _ = await replay_cli(capsys, improve_session, *against, "--examples", "1")
    add = next(tool for tool in json.loads(out)["tools"] if tool["tool"] == "add")
    assert (add["broken"], len(add["broken_examples"])) == (2, 1)
    _, out, _ = await replay_cli(capsys, improve_session, "--against", f"{tool_file.module}:tools", "--examples", "1")
    assert "    and 1 more broken (--examples N shows more)" in out


async def test_without_against_the_tools_serve_would_serve(improve_session: Session, tool_file: ToolFile,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """No tools named: the example tools, none of which the session called; tools named in the
    settings: those."""
    _, out, _ = await replay_cli(capsys, improve_session, "--json")
    answer = json.loads(out)
    assert answer["target"].startswith("the tools toolspan serve would serve (3 tools: get_weather")
    assert (answer["replayed"], answer["not_replayed"]) == (0, {"not_in_target": scripted.CALLS})
    monkeypatch.setenv("TOOLSPAN_TOOLS", json.dumps([f"{tool_file.module}:tools"]))
    _, out, _ = await replay_cli(capsys, improve_session, "--json")
    assert per_tool(json.loads(out)) == CHANGED


async def test_the_settings_aliases_and_repair_are_the_gateways(improve_session: Session, tool_file: ToolFile,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The tools as they were, parsed as a gateway with these settings would: the operator's aliases
    for `path` take read_file's three renames; repair then mends add's "1" and search's bare "red"."""
    unchanged = ("--json", "--against", f"{tool_file.module}:unchanged", "--fail-on-regression")
    monkeypatch.setenv("TOOLSPAN_TOOL_ALIASES", json.dumps({"read_file": {"path": ["file_path", "filepath"]}}))
    status, out, _ = await replay_cli(capsys, improve_session, *unchanged)
    answer = json.loads(out)
    assert (status, answer["fixed"], answer["still_rejected"], answer["repaired"]) == (0, 3, 2, 0)
    assert per_tool(answer)["read_file"]["fixed"] == 3
    monkeypatch.setenv("TOOLSPAN_ARGUMENT_REPAIR", "apply")
    status, out, _ = await replay_cli(capsys, improve_session, *unchanged)
    answer = json.loads(out)
    assert (status, answer["fixed"], answer["still_rejected"], answer["repaired"]) == (0, 5, 0, 2)
    assert {tool["tool"]: tool["repaired"] for tool in answer["tools"]} == {"read_file": 0, "add": 1, "search": 1,
                                                                            "login": 0}
    monkeypatch.setenv("TOOLSPAN_TOOL_ALIASES", json.dumps({"read_file": {"nothing_like_it": ["x"]}}))
    status, _, err = await replay_cli(capsys, improve_session, *unchanged)
    assert status == 2
    assert err.startswith("toolspan: tool_aliases does not fit the tools replayed against: ")
    assert err.count("\n") == 1


async def test_a_key_that_may_no_longer_use_a_tool(improve_session: Session, tool_file: ToolFile,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The keys' `tools` lists, as the gateway (and the page's replay) applies them: beta may no
    longer use add, so its one call of it (ok) is of a tool not in the target, not still passing;
    alpha's calls of add are replayed as before."""
    keys = {**scripted.KEYS, "beta": {**scripted.KEYS["beta"], "tools": ["read_file", "search"]}}
    monkeypatch.setenv("TOOLSPAN_KEYS", json.dumps(keys))
    _, out, _ = await replay_cli(capsys, improve_session, "--json", "--against", f"{tool_file.module}:unchanged")
    answer = json.loads(out)
    assert answer["not_replayed"] == {"not_in_target": 1}
    assert (answer["replayed"], answer["still_passing"], answer["still_rejected"]) == (scripted.CALLS - 1, 6, 5)
    # Against the changed tools, beta's call of add is no regression: beta may not call add at all.
    status, out, _ = await replay_cli(capsys, improve_session, "--json", "--against", f"{tool_file.module}:tools",
                                      "--key", "beta", "--fail-on-regression")
    answer = json.loads(out)
    assert (status, answer["broken"], answer["not_replayed"]) == (0, 0, {"not_in_target": 1})
    assert per_tool(answer) == {**CHANGED_BETA, "add": dict.fromkeys(COUNTS, 0) | {"calls": 1}}
    assert not tool_file.ran.exists()


@pytest.mark.slow
async def test_the_command_fails_ci_on_a_regression(improve_session: Session, tool_file: ToolFile) -> None:
    """As CI runs it: `toolspan trajectories replay --fail-on-regression` in a process of its own,
    from the folder of the tool file (imported from there, as `toolspan serve --tools` imports)."""
    found = []
    for tools in ("tools", "unchanged"):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "trajectories", "replay", "--db", str(improve_session.path),
            "--against", f"{tool_file.module}:{tools}", "--fail-on-regression",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        found.append((process.returncode, err.decode(), "2 recorded passes would now be rejected" in out.decode()))
    assert found == [(1, "toolspan: 2 recorded passes would now be rejected (--fail-on-regression)\n", True),
                     (0, "", False)]
    assert not tool_file.ran.exists()


# --- the client's own tools, against a schema file -------------------------------------------------

OPEN_FILE = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
             "required": ["path"]}
# What the client now declares: `file_path` (what the model sent first) instead of `path`.
OPEN_FILE_NOW = {"type": "object", "properties": {"file_path": {"type": "string"}, "lines": {"type": "integer"}},
                 "required": ["file_path"], "additionalProperties": False}


async def client_calls(session: Session) -> None:
    """Two requests declaring the client's tool open_file, whose calls the gateway checks and hands
    over: {"file_path"} (rejected, missing_arguments) and {"path"} (ok)."""
    client = AsyncOpenAI(base_url=f"{session.gateway.url}/v1", api_key=scripted.ALPHA_KEY, max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "open_file", "parameters": OPEN_FILE}}]
    async with client:
        for arguments in ({"file_path": "notes.txt"}, {"path": "notes.txt"}):
            session.upstreams[scripted.MODEL_A].policy.then(Reply(tool_calls=[("open_file", arguments)]))  # type: ignore[attr-defined]
            answer = await client.chat.completions.create(model=scripted.MODEL_A, messages=USER,  # type: ignore[arg-type]
                                                          tools=tools)
            assert answer.choices[0].finish_reason == "tool_calls"  # handed over to the client
    assert session.gateway.observability.store is not None
    await session.gateway.observability.store.flushed()


@pytest.mark.parametrize("shape", ["chat", "responses", "messages", "names"])
async def test_client_calls_replay_against_a_schema_file(improve_session: Session, tmp_path: Path, shape: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    await client_calls(improve_session)
    declared = {"chat": [{"type": "function", "function": {"name": "open_file", "parameters": OPEN_FILE_NOW}}],
                "responses": [{"type": "function", "name": "open_file", "parameters": OPEN_FILE_NOW}],
                "messages": {"tools": [{"name": "open_file", "input_schema": OPEN_FILE_NOW}]},  # a request body
                "names": {"open_file": OPEN_FILE_NOW}}[shape]
    schemas = tmp_path / "schemas.json"
    schemas.write_text(json.dumps(declared), encoding="utf-8")
    status, out, _ = await replay_cli(capsys, improve_session, "--json", "--against", str(schemas),
                                      "--fail-on-regression")
    assert status == 1
    answer = json.loads(out)
    assert answer["target"] == f"the schemas of {schemas} (1 tools)"
    [tool] = answer["tools"][:1]
    assert (tool["tool"], tool["side"]) == ("open_file", "client")
    assert {name: tool[name] for name in COUNTS} == {"calls": 2, "fixed": 1, "broken": 1, "still_passing": 0,
                                                     "still_rejected": 0, "uncertain": 0}
    [broken] = tool["broken_examples"]
    assert json.loads(broken["arguments"]) == {"path": "notes.txt"}
    assert broken["now_reason"] == "missing_arguments"
    assert "file_path" in broken["now_message"]
    assert answer["not_replayed"] == {"not_in_target": scripted.CALLS}  # the gateway's tools: not in the file
    # Against the session's tools, the client's calls have no schema to be replayed against.
    _, out, _ = await replay_cli(capsys, improve_session, "--json", "--against", "tests.improve.session:tools")
    assert json.loads(out)["not_replayed"] == {"no_schema": 2}
