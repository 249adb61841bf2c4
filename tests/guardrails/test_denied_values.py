"""The `denied_values` built-in: glob patterns of argument values per tool (name or glob, '*'
for every tool), matched case-sensitively against every string value, nested ones included, and
against the path a value resolves to, so that `..` and `./` cannot slip a path past a pattern."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.guardrails import GuardedCall
from gateway.guardrails.builtin_values import DeniedValues, normalised_path

DENIED = {"fs__*": ["/etc/*", "*/.ssh/*"], "http_get": ["*.internal*"], "*": ["rm -rf *"]}


def check(tool: str, arguments: dict[str, Any], denied: dict[str, list[str]] | None = None) -> str | None:
    verdict = DeniedValues(DENIED if denied is None else denied).before_execute(GuardedCall(tool, "call_1", arguments))
    if verdict is None:
        return None
    assert verdict.decision == "deny"
    assert verdict.reason is not None
    return verdict.reason


@pytest.mark.parametrize(("tool", "arguments", "where", "pattern"), [
    ("fs__read", {"path": "/etc/passwd"}, "path", "/etc/*"),
    ("fs__read", {"path": "/etc/../etc/passwd"}, "path", "/etc/*"),
    ("fs__read", {"path": "/srv/./../etc/shadow"}, "path", "/etc/*"),
    ("fs__read", {"path": "//etc//passwd"}, "path", "/etc/*"),
    ("fs__write", {"files": [{"name": "ok.txt"}, {"name": "/home/ada/.ssh/id_ed25519"}]}, "files[1].name",
     "*/.ssh/*"),
    ("http_get", {"url": "https://db.internal:5432/"}, "url", "*.internal*"),
    ("shell", {"command": "rm -rf /"}, "command", "rm -rf *"),
    ("fs__read", {"command": "rm -rf tmp"}, "command", "rm -rf *"),
])
def test_a_denied_value_is_refused_naming_the_argument_and_the_pattern(tool: str, arguments: dict[str, Any],
                                                                       where: str, pattern: str) -> None:
    reason = check(tool, arguments)
    assert reason is not None
    assert f"argument '{where}'" in reason
    assert f"pattern '{pattern}'" in reason
    assert f"tool '{tool}'" in reason


@pytest.mark.parametrize(("tool", "arguments"), [
    ("fs__read", {"path": "/srv/etc/passwd"}),
    ("fs__read", {"path": "/ETC/passwd"}),  # case-sensitive, as the file system is
    ("fs__read", {"path": "etc/passwd"}),  # relative: the tool's own directory
    ("fs__read", {"path": "/etc"}),
    ("http_get", {"path": "/etc/passwd"}),  # /etc/* is fs__*'s, not http_get's
    ("shell", {"command": "ls -la", "count": 3, "flags": [True, None]}),
    ("fs__read", {"/etc/passwd": "the names of arguments are not values"}),
])
def test_other_values_pass(tool: str, arguments: dict[str, Any]) -> None:
    assert check(tool, arguments) is None


def test_a_tool_without_patterns_is_not_walked() -> None:
    assert check("search", {"q": "/etc/passwd"}, {"fs__*": ["/etc/*"]}) is None


def test_a_long_value_is_quoted_only_in_part() -> None:
    reason = check("fs__read", {"path": "/etc/" + "x" * 5000})
    assert reason is not None
    assert len(reason) < 400


@pytest.mark.parametrize(("value", "resolved"), [
    ("/etc/../etc/passwd", "/etc/passwd"),
    ("./a/../b", "b"),
    ("//etc/passwd", "/etc/passwd"),
    ("/var/log/", None),
    ("/var/./log/", "/var/log/"),
    ("plain", None),
    ("/etc/passwd", None),
])
def test_the_path_a_value_resolves_to(value: str, resolved: str | None) -> None:
    assert normalised_path(value) == resolved
