"""Properties of argument repair, over generated declarations and calls: a rename is never a guess
between two accepted names that fit, and whatever repair hands the tool fits the tool's schema and
changes no value beyond its type."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gateway.tools import Param, Rejection, Tool, ToolContext
from gateway.tools.params import fitting_names
from gateway.tools.repair import REPAIR_SIMILARITY, repaired
from gateway.tools.results import Repair

CONTEXT = ToolContext("call-1")
WORDS = st.sampled_from(["path", "file", "name", "page", "size", "user", "id", "query", "limit", "max", "start",
                         "end", "date", "tags", "count", "mode", "url", "dir", "target", "source"])
SEPARATORS = st.sampled_from(["_", "-", ""])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "array"])
# Values of each type, and strings or bare values near them: what a model sends for it.
NEAR = {"string": st.text(max_size=4),
        "integer": st.one_of(st.integers(), st.integers().map(str)),
        "number": st.one_of(st.floats(allow_nan=False), st.floats().map(repr), st.integers().map(str)),
        "boolean": st.one_of(st.booleans(), st.sampled_from(["true", "false", "TRUE", "yes"])),
        "array": st.one_of(st.lists(st.text(max_size=2), max_size=2), st.text(max_size=3), st.integers())}


@st.composite
def names(draw: st.DrawFn) -> str:
    parts = draw(st.lists(WORDS, min_size=1, max_size=3))
    joined = draw(SEPARATORS).join(parts)
    return joined.upper() if draw(st.booleans()) and len(parts) == 1 else joined


@st.composite
def values(draw: st.DrawFn) -> Any:
    return draw(st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                          st.booleans(), st.none(), st.text(max_size=6),
                          st.sampled_from(["1", "-3", "0", "2.5", "1e3", "true", "false", "True", " 4", "07",
                                           "NaN", "x"]),
                          st.lists(st.integers(), max_size=2)))


@st.composite
def declarations(draw: st.DrawFn) -> tuple[Tool, dict[str, Any]]:
    """A tool of a few typed parameters, some required, and a call of it under names near theirs."""
    declared = draw(st.lists(names(), min_size=1, max_size=4, unique_by=str.lower))
    params = []
    for name in declared:
        kind = draw(TYPES)
        params.append(Param(name, kind, required=draw(st.booleans()),
                            item_type=draw(st.sampled_from([None, "string", "integer"])) if kind == "array" else None))
    kinds = {param.name: param.type for param in params}
    tool = Tool(name="t", function=lambda args: args, parameters=params, validate_schema=True)
    sent: dict[str, Any] = {}
    for name in declared:  # each parameter sent as declared, respelled, mistyped, or not at all
        spelled = draw(st.sampled_from([name, name.upper(), name.replace("_", ""), name.replace("_", "-"),
                                        name[:-1] if len(name) > 4 else name, f"the_{name}", None]))
        if spelled is not None:
            sent[spelled] = draw(st.one_of(values(), NEAR[kinds[name]]))
    sent.update(draw(st.dictionaries(names(), values(), max_size=2)))
    return tool, sent


def _mend(tool: Tool, sent: dict[str, Any]) -> Repair | None:
    async def run() -> Repair | None:
        parsed = await tool.parse_arguments(sent, CONTEXT)
        if not isinstance(parsed, Rejection):
            return None
        found = await repaired(tool, sent, parsed, CONTEXT, applied=True)
        return None if found is None else found[0]
    return asyncio.run(run())


@settings(max_examples=400, deadline=None)
@given(declarations())
def test_what_repair_hands_the_tool_fits_its_schema_and_keeps_every_value(case: tuple[Tool, dict[str, Any]]) -> None:
    tool, sent = case
    repair = _mend(tool, sent)
    event("repaired" if repair is not None else "not repaired")
    if repair is None:
        return
    assert Draft202012Validator(tool.declared_schema).is_valid(repair.after)
    renamed = dict(change.removeprefix("rename ").split(" -> ") for change in repair.changes
                   if change.startswith("rename "))
    assert set(repair.after) == {renamed.get(name, name) for name in sent}
    for name, value in sent.items():
        mended = repair.after[renamed.get(name, name)]
        if json.dumps(mended) == json.dumps(value):  # untouched (json: 1, 1.0 and true differ, NaN is NaN)
            continue
        if isinstance(mended, list):  # wrapped: the one value, as it was
            assert mended == [value]
            assert type(mended[0]) is type(value)
        elif isinstance(mended, bool):  # a string spelling exactly this boolean
            assert value == ("true" if mended else "false")
        else:  # a string spelling exactly this number
            assert isinstance(value, str)
            assert isinstance(mended, int | float)
            assert mended == (int(value) if isinstance(mended, int) else float(value))  # exactly


@settings(max_examples=400, deadline=None)
@given(declarations())
def test_a_rename_is_made_only_when_exactly_one_name_fits(case: tuple[Tool, dict[str, Any]]) -> None:
    tool, sent = case
    repair = _mend(tool, sent)
    if repair is None:
        return
    unsent = [name for name in tool.accepted_names if name not in sent]
    for change in repair.changes:
        if change.startswith("rename "):
            was, now = change.removeprefix("rename ").split(" -> ")
            assert fitting_names(was, unsent, REPAIR_SIMILARITY) == [now]


@settings(max_examples=200, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=2, unique=True), WORDS, WORDS, values())
def test_two_names_that_both_fit_are_never_chosen_between(core: list[str], before: str, after: str,
                                                          value: Any) -> None:
    """Two accepted names that each hold the sent name as a run of whole words (`date` in
    `start_date` and `end_date`) both fit: no rename, whatever else is sent."""
    sent = "_".join(core)
    first, second = "_".join([before, *core]), "_".join([*core, after])
    if len({sent, first, second}) < 3:
        return
    tool = Tool(name="t", function=lambda args: args, validate_schema=True,
                parameters=[Param(first, "string", required=True), Param(second, "string", required=True)])
    assert len(fitting_names(sent, [first, second], REPAIR_SIMILARITY)) == 2
    repair = _mend(tool, {sent: value})
    assert repair is None or not any(change.startswith(f"rename {sent} ") for change in repair.changes)
