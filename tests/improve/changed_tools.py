"""The session's tools (tests.improve.session) as a team might change them, written into a test's
folder as a tool file for `toolspan trajectories replay --against`: read_file takes the names the
models invented for `path`, add needs a third integer, login a password of at least 12 characters;
search is as it was. Every body notes that it ran in a file beside the module: a replay must
leave none."""

from __future__ import annotations

CHANGED_TOOLS = '''
from pathlib import Path
from typing import Any

from gateway.tools import Param, Tool, ToolError

RAN = Path(__file__).with_name("bodies-ran")


def _ran(args: dict[str, Any]) -> str:
    with RAN.open("a", encoding="utf-8") as out:
        out.write("a body ran\\n")
    return "ran"


def _read_args(args: dict[str, Any]) -> dict[str, Any]:
    found = dict(args)
    for invented in ("file_path", "filepath"):
        if invented in found and "path" not in found:
            found["path"] = found.pop(invented)
    if not isinstance(found.get("path"), str):
        raise ToolError("read_file needs path, a string")
    return found


LOGIN = {"type": "object", "required": ["user", "password"],
         "properties": {"user": {"type": "string"}, "password": {"type": "string", "minLength": 12}}}


def _search() -> Tool:
    return Tool(name="search", description="Search by tags.", function=_ran, validate_schema=True,
                parameters=[Param("query", "string", required=True),
                            Param("tags", "array", item_type="string", required=True)])


def tools() -> list[Tool]:
    return [
        Tool(name="read_file", description="Read a file.", function=_ran, parse_args=_read_args,
             parameters=[Param("path", "string", required=True), Param("offset", "integer")]),
        Tool(name="add", description="Add three integers.", function=_ran, validate_schema=True,
             parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True),
                         Param("c", "integer", required=True)]),
        _search(),
        Tool(name="login", description="Log in.", function=_ran, validate_schema=True, parameters_schema=LOGIN),
    ]


def unchanged() -> list[Tool]:
    """The tools as the session ran them, but for bodies that note they ran."""
    return [
        Tool(name="read_file", description="Read a file.", function=_ran,
             parameters=[Param("path", "string", required=True), Param("offset", "integer")]),
        Tool(name="add", description="Add two integers.", function=_ran, validate_schema=True,
             parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)]),
        _search(),
        Tool(name="login", description="Log in.", function=_ran,
             parameters=[Param("user", "string", required=True), Param("password", "string", required=True)]),
    ]
'''

# The session replayed against tools(), counted by hand from tests.improve.session.TRAJECTORIES:
# read_file: file_path (alpha), filepath twice (beta) were rejected and now pass; /a, /c, /d passed
#   and still do.
# add: {"a": "1", "b": 2} was rejected and still is; {"a": 1, "b": 2} and {"a": 2, "b": 3} passed
#   and now miss c.
# search: the string tags were rejected and still are; the list passed and still does.
# login: passed; its password is recorded masked ("[REDACTED]", 10 characters) and now too short,
#   which the mask may be the cause of: uncertain, not broken.
CHANGED = {"read_file": {"calls": 6, "fixed": 3, "broken": 0, "still_passing": 3, "still_rejected": 0, "uncertain": 0},
           "add": {"calls": 3, "fixed": 0, "broken": 2, "still_passing": 0, "still_rejected": 1, "uncertain": 0},
           "search": {"calls": 2, "fixed": 0, "broken": 0, "still_passing": 1, "still_rejected": 1, "uncertain": 0},
           "login": {"calls": 1, "fixed": 0, "broken": 0, "still_passing": 0, "still_rejected": 0, "uncertain": 1}}
# The same of key beta's trajectories only: filepath twice, the search pair, add 2+3 and read_file /d.
CHANGED_BETA = {"read_file": {"calls": 3, "fixed": 2, "broken": 0, "still_passing": 1, "still_rejected": 0,
                              "uncertain": 0},
                "add": {"calls": 1, "fixed": 0, "broken": 1, "still_passing": 0, "still_rejected": 0, "uncertain": 0},
                "search": {"calls": 2, "fixed": 0, "broken": 0, "still_passing": 1, "still_rejected": 1,
                           "uncertain": 0}}
# Against unchanged(): every call as it was recorded (7 passes, 5 rejections).
UNCHANGED_TOTALS = {"calls": 12, "replayed": 12, "fixed": 0, "broken": 0, "still_passing": 7, "still_rejected": 5,
                    "uncertain": 0}
