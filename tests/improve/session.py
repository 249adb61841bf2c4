"""A scripted session over two models, two upstreams and two gateway keys, with renames, type
errors, verbatim retries and recoveries: the store the tests of replay, aliases, repair, export and
the report by model read. Every figure the tests check against is counted by hand below."""

from __future__ import annotations

from typing import Any

from gateway.demo.model import Reply
from gateway.tools import Param, Tool, ToolRegistry

ALPHA_KEY, BETA_KEY, OPERATOR_KEY = "sk-alpha-key", "sk-beta-key", "sk-operator-key"
# The operator's key makes no request: with it, the page shows every key's trajectories.
KEYS = {"alpha": {"key": ALPHA_KEY}, "beta": {"key": BETA_KEY}, "operator": {"key": OPERATOR_KEY, "operator": True}}
MODEL_A, MODEL_B = "model-a", "model-b"  # model-a on the upstream "primary", model-b on "secondary"
SECRET = "hunter2-" + "x" * 12  # sent as a `password` argument: redacted wherever it is recorded


def _read(args: dict[str, Any]) -> str:
    return f"the text of {args['path']}"


def _add(args: dict[str, Any]) -> str:
    return str(args["a"] + args["b"])


def _search(args: dict[str, Any]) -> str:
    return f"{len(args['tags'])} results for {args['query']}"


def _login(args: dict[str, Any]) -> str:
    return f"logged in as {args['user']}"


def tools() -> list[Tool]:
    """The tools as the session ran them."""
    return [
        Tool(name="read_file", description="Read a file.", function=_read,
             parameters=[Param("path", "string", required=True), Param("offset", "integer")]),
        Tool(name="add", description="Add two integers.", function=_add, validate_schema=True,
             parameters=[Param("a", "integer", required=True), Param("b", "integer", required=True)]),
        Tool(name="search", description="Search by tags.", function=_search, validate_schema=True,
             parameters=[Param("query", "string", required=True),
                         Param("tags", "array", item_type="string", required=True)]),
        Tool(name="login", description="Log in.", function=_login,
             parameters=[Param("user", "string", required=True), Param("password", "string", required=True)]),
    ]


def registry() -> ToolRegistry:
    return ToolRegistry(tools())


# One trajectory each: (key, model, the model's turns: each a list of (tool, arguments), then its answer).
# The comment on a call says what it was recorded as.
TRAJECTORIES: list[tuple[str, str, list[list[tuple[str, Any]]]]] = [
    ("alpha", MODEL_A, [
        [("read_file", {"file_path": "/a"})],  # rejected: missing_arguments, file_path -> path
        [("read_file", {"path": "/a"})],  # ok: corrected, recovered in 1 turn
    ]),
    ("alpha", MODEL_A, [
        [("add", {"a": "1", "b": 2})],  # rejected: schema_violation ("1" is not an integer)
        [("add", {"a": 1, "b": 2})],  # ok: corrected, recovered in 1 turn
    ]),
    ("alpha", MODEL_A, [
        [("login", {"user": "ann", "password": SECRET})],  # ok
        [("read_file", {"path": "/c", "offset": 5})],  # ok
    ]),
    ("beta", MODEL_B, [
        [("read_file", {"filepath": "/b"})],  # rejected: missing_arguments, filepath -> path
        [("read_file", {"filepath": "/b"})],  # rejected: verbatim retry, never recovered
    ]),
    ("beta", MODEL_B, [
        [("search", {"query": "x", "tags": "red"})],  # rejected: schema_violation (not an array)
        [("search", {"query": "x", "tags": ["red"]})],  # ok: corrected, recovered in 1 turn
    ]),
    ("beta", MODEL_B, [
        [("add", {"a": 2, "b": 3}), ("read_file", {"path": "/d"})],  # ok, ok (one turn, two calls)
    ]),
]


def replies(turns: list[list[tuple[str, Any]]]) -> list[Reply]:
    """One trajectory's replies: its turns, then an answer."""
    return [*(Reply(tool_calls=calls) for calls in turns), Reply(content="done")]


# The same session with argument repair on (apply; observe for beta's key) and the operator's alias
# filepath for read_file's path: what each call is then recorded as, in order (tool, outcome, repair
# mode, its changes, the aliases used).
MENDED_SETTINGS: dict[str, Any] = {
    "argument_repair": "apply", "tool_aliases": {"read_file": {"path": ["filepath"]}},
    "keys": {**KEYS, "beta": {**KEYS["beta"], "argument_repair": "observe"}}}
MENDED_CALLS: list[tuple[str, str, str | None, list[str] | None, dict[str, str]]] = [
    ("read_file", "repaired", "apply", ["rename file_path -> path"], {}),  # it ran: the next call is no retry
    ("read_file", "ok", None, None, {}),
    ("add", "repaired", "apply", ["type a: string -> integer"], {}),
    ("add", "ok", None, None, {}),
    ("login", "ok", None, None, {}),
    ("read_file", "ok", None, None, {}),
    ("read_file", "ok", None, None, {"filepath": "path"}),  # the alias: no repair needed
    ("read_file", "ok", None, None, {"filepath": "path"}),
    ("search", "rejected", "observe", ["wrap tags in an array"], {}),  # beta's key: recorded, still rejected
    ("search", "ok", None, None, {}),
    ("add", "ok", None, None, {}),
    ("read_file", "ok", None, None, {}),
]


# Hand counts of the session above.
CALLS = 12
CALLS_BY_MODEL = {MODEL_A: 6, MODEL_B: 6}
REJECTED_BY_MODEL = {MODEL_A: {"missing_arguments": 1, "schema_violation": 1},
                     MODEL_B: {"missing_arguments": 2, "schema_violation": 1}}
FAILURES_BY_MODEL = {MODEL_A: 2, MODEL_B: 2}  # runs of failed calls of a tool in a trajectory
RECOVERIES_BY_MODEL = {MODEL_A: 2, MODEL_B: 1}
VERBATIM_BY_MODEL = {MODEL_A: 0, MODEL_B: 1}
REQUESTS_BY_MODEL = {MODEL_A: 3, MODEL_B: 3}  # one request per trajectory
ROUNDS_BY_MODEL = {MODEL_A: 9, MODEL_B: 8}  # model turns: 3 per trajectory, but one of B's has 2
# Renamed arguments: (tool, name sent, name suggested) -> (calls, calls whose failure recovered).
# "filepath" gets no suggestion: "path" is in it, but not as a word of its own.
RENAMES_BY_MODEL = {MODEL_A: {("read_file", "file_path", "path"): (1, 1)},
                    MODEL_B: {("read_file", "filepath", None): (2, 0)}}
CORRECTED_FAILURES = 3  # failed calls a later ok call corrected (its retry link, kind corrected): a dataset's pairs
