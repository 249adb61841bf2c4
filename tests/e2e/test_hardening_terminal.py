"""`toolspan trajectories` prints what models, callers and providers chose: tool names, argument
names and values, model names, provider errors. None of it may drive the terminal: an ESC sequence
(a new window title, a cleared screen, a rewritten line), a CR that overwrites what came before,
a C1 CSI, a bidirectional override, or a line feed that forges a line of its own."""

from __future__ import annotations

import json
import re

import pytest

from gateway.demo.model import Reply
from tests.conftest import USER, Stack, StackFactory, toolspan_cli

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
CSI = "\x9b31m"  # the one-byte CSI of C1: red text on many terminals
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # all but the layout's own \n


@pytest.fixture
async def hostile(make_stack: StackFactory) -> Stack:
    """A store holding every kind of string a model or a provider picks, with control characters."""
    stack = await make_stack()
    stack.script.then(
        Reply(tool_calls=[(f"{TITLE}read_file", {}), ("read_file", {f"path\r{CLEAR}": f"/etc\n\u202epasswd{CSI}"})]),
        Reply(tool_calls=[("read_file", {f"path\r{CLEAR}": "/etc"})]),  # a verbatim retry: stuck, in the report
        Reply(status=500, error=f"upstream fell over{CLEAR}\rOK"))
    with pytest.raises(Exception, match="502"):
        await stack.ask(False, messages=USER, model=f"gpt{TITLE}", extra_headers={"X-Trajectory-Id": "hostile"})
    await stack.store.flushed()
    return stack


@pytest.mark.parametrize("command", [["list"], ["show", "hostile"], ["report"]], ids=["list", "show", "report"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
async def test_stored_strings_never_reach_the_terminal_raw(hostile: Stack, command: list[str], as_json: bool) -> None:
    flags = ["--json"] if as_json else []
    out = await toolspan_cli("trajectories", *command, "--db", str(hostile.store.path), *flags)
    assert RAW_CONTROL.search(out) is None, repr(out)
    if as_json:
        json.loads(out)  # the escapes are JSON's own: still a document
    else:
        assert "\\u001b" in out  # shown, not acted on
    if command[0] == "show":
        assert "read_file" in out
        assert "\\u009b31m" in out
        if not as_json:
            assert "\\r" in out  # the renamed argument's CR, made visible
            lines = out.splitlines()
            assert not any(line.startswith("OK") for line in lines)  # the provider's text forged no line
