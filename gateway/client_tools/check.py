"""The parse step for the calls a model makes to the client's own tools (issue 36): the arguments
checked against the schema the request declared, with the contract and the words of the gateway's
own schema-checked tools (an MCP tool's parse step, gateway.tools.schema). Nothing here changes a
call: the result is an observation, for the span, the metrics and, when enforcing, the model.

A declared schema is data (issue 53): its references are resolved inside it only, and compiling it
and checking a call against it spend from a budget (gateway.tools.schema_bounds). A check starts on
the event loop with the small INLINE budget, which a usual schema and call fit within;
one that goes past it is done again on a thread of the check's own with the OFF_LOOP budget, and
past that the call is `unchecked` (`too_complex`)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson
from jsonschema import FormatChecker
from jsonschema.protocols import Validator

from gateway.tools.arguments import read_arguments
from gateway.tools.executor import refusal
from gateway.tools.params import NameCheck, check_names, schema_names
from gateway.tools.results import Rejection, RejectionReason, ToolOutcome, rejected
from gateway.tools.schema import closed_to_other_names, describe_problems, schema_validator, value_problems
from gateway.tools.schema_bounds import INLINE, OFF_LOOP, Budget, OverBudget, metered
from gateway.tools.threads import ToolsBusy, ToolThreads
from gateway.wire.json_depth import nests_deeper

Outcome = Literal["ok", "rejected", "unchecked"]
# Why a call was not checked: its tool's schema is over the size limit, its tool is past the
# count limit, the schema is not a JSON Schema of an object, the tool is not a function tool, the
# schema refers to something outside itself, or checking would cost more than the budget allows.
Unchecked = Literal["schema_too_large", "too_many_tools", "invalid_schema", "not_a_function", "remote_ref",
                    "too_complex"]

MAX_SCHEMA_BYTES = 64 * 1024
MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 64  # deeper schemas are not followed: the validator recurses per level
THREAD_GRACE_SECONDS = 0.5  # a check off the loop is waited for this long past its budget, then given up
MAX_INLINE_ARGUMENTS = 16 * 1024  # longer arguments are read and checked off the loop from the start
MAX_INLINE_SCHEMA_BYTES = 2 * 1024  # a longer schema is compiled off the loop from the start
# Arguments holding more JSON values than this are not read at all (`too_complex`): reading them is one
# call into the JSON parser that holds the interpreter's lock throughout, whichever thread makes it.
MAX_CHECKED_VALUES = 20_000
CACHE_SIZE = 1024
# Formats whose check is cheap, exact and needs no optional package; the gateway's own tools check
# none. "regex" is left out (Python's syntax is not ECMA 262's), "time" too (jsonschema checks
# draft 3's form there, which refuses RFC 3339 times), and any format not listed passes.
FORMATS = ("date", "email", "ipv4", "ipv6", "uuid", "date-time")


@dataclass(frozen=True)
class ClientCheck:
    """One client call's parse step. `rejection` (with `outcome="rejected"`) holds the reason and
    the model-facing text, exactly as a gateway tool's rejection; `unchecked` says why a call was
    not checked."""

    outcome: Outcome
    rejection: Rejection | None = None
    unchecked: Unchecked | None = None
    # the arguments as the check read them (a call that fits), handed on, not part of the verdict
    arguments: dict[str, Any] | None = field(default=None, compare=False)

    def outcome_of(self, call_id: str, tool: str) -> ToolOutcome:
        """The check as a tool call's outcome (what the span records; rejected: what the model is
        told when the gateway answers the call itself)."""
        if self.rejection is not None:
            return rejected(call_id, tool, self.rejection)
        return ToolOutcome(call_id, tool, self.outcome, "", unchecked=self.unchecked)

    @property
    def reason(self) -> RejectionReason | None:
        return None if self.rejection is None else self.rejection.reason

    @property
    def message(self) -> str | None:
        return None if self.rejection is None else self.rejection.message

    @property
    def names(self) -> NameCheck | None:
        return None if self.rejection is None else self.rejection.names

    @property
    def missing(self) -> tuple[str, ...]:
        return () if self.names is None else self.names.missing

    @property
    def unrecognized(self) -> tuple[str, ...]:
        return () if self.names is None else self.names.unrecognized

    @property
    def suggestions(self) -> tuple[tuple[str, str], ...]:
        """(sent, meant) pairs, as the gateway's tool.call spans show them."""
        return () if self.names is None else self.names.suggestions


TOO_COMPLEX = ClientCheck("unchecked", unchecked="too_complex")


class _PastInline:
    """A check that went past the INLINE budget, to be done again off the event loop."""


PAST_INLINE = _PastInline()


@dataclass(frozen=True)
class CompiledSchema:
    """What the check needs of one declared schema, made once per distinct schema."""

    validator: Validator
    required: tuple[str, ...]
    accepted: tuple[str, ...]
    closed: bool  # names outside `properties` are refused (gateway.tools.schema.closed_to_other_names)
    fitting: NameCheck  # check_names's result for names that fit: every required one, none unknown
    required_set: frozenset[str]
    accepted_set: frozenset[str]

    def names_of(self, args: dict[str, Any]) -> NameCheck:
        """check_names(args, required, accepted), without its work when the names fit (most calls)."""
        if self.required_set <= args.keys() and (not self.accepted or args.keys() <= self.accepted_set):
            return self.fitting
        return check_names(args, self.required, self.accepted)


class SchemaCache:
    """Compiled schemas by the hash of their JSON, the `size` most recently used kept. One per app
    (it lives on the app, never in a module), used from the event loop only. A schema that is not
    checked is kept too (as the reason), so it is not tried again on every request. `compiles` and
    `hits` count what happened, for tests and the bench.

    The key is the JSON as declared, keys unsorted: the diagnostic lists the names in the order
    the schema declares them, and jsonschema quotes an enum's or a const's objects in theirs, so
    two orders of one schema are two entries (a client sends one order, request after request)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = max(1, size)
        self.compiles = 0
        self.hits = 0
        self._entries: OrderedDict[bytes, CompiledSchema | Unchecked] = OrderedDict()
        self.formats = FormatChecker([name for name in FORMATS if name in FormatChecker.checkers])

    def __len__(self) -> int:
        return len(self._entries)

    def compiled(self, encoded: bytes, schema: Any) -> CompiledSchema | Unchecked | _PastInline:
        """The compiled form of `schema`, whose JSON is `encoded`, or why it is not checked; if
        compiling it goes past the INLINE budget, PAST_INLINE (and `add` takes what compile_schema
        makes of it off the event loop)."""
        key = _key(encoded)
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.compiles += 1
        if len(encoded) > MAX_INLINE_SCHEMA_BYTES:
            return PAST_INLINE  # its metaschema check alone would take the inline budget
        with metered(INLINE):
            try:
                entry = compile_schema(schema, self.formats)
            except OverBudget:
                return PAST_INLINE
        self.add(encoded, entry)
        return entry

    def add(self, encoded: bytes, entry: CompiledSchema | Unchecked) -> None:
        self._entries[_key(encoded)] = entry
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


def _key(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=16).digest()


def compile_schema(declared: Any, formats: FormatChecker) -> CompiledSchema | Unchecked:
    """What the check needs of `declared`, or why its calls are not checked. Spends from the
    budget of the check under way (schema_bounds.metered): past it, OverBudget."""
    if not isinstance(declared, dict) or declared.get("type", "object") != "object":
        return "invalid_schema"  # arguments are an object: no other schema can be meant
    if not isinstance(declared.get("properties", {}), dict) or nests_deeper(declared, MAX_SCHEMA_DEPTH):
        return "invalid_schema"
    try:
        schema = json.loads(json.dumps(declared))  # a private copy, as a gateway tool keeps: not the request's dicts
        built = schema_validator("client", schema)
    except OverBudget:
        raise
    except Exception:  # not JSON Schema (ToolDeclarationError), or one jsonschema cannot read: not checked
        return "invalid_schema"
    if isinstance(built, str):
        return cast(Unchecked, built)
    required, accepted = schema_names(schema)
    fitting = NameCheck(tuple(required), tuple(accepted), (), (), ())
    return CompiledSchema(built.evolve(format_checker=formats), fitting.required, fitting.accepted,
                          closed_to_other_names(schema), fitting, frozenset(required), frozenset(accepted))


@dataclass(frozen=True)
class _Declared:
    schema: Any  # the declared parameters, as the request sent them
    unchecked: Unchecked | None  # set when the tool's calls are not checked whatever the schema


class ClientTools:
    """The tools one request declares, for checking the calls the model makes to them. Made once
    per request from its `tools`: Chat's `{"type": "function", "function": {"name", "parameters"}}`,
    the Responses API's `{"type": "function", "name", "parameters"}` and Anthropic's `{"name",
    "input_schema"}` (no `type`, or "custom"). Tools of other types are not function tools: calls of
    theirs come out unchecked. Past `max_tools` function tools, and for a schema whose JSON is over
    `max_schema_bytes`, calls are unchecked too. A schema is compiled (through `cache`) when a call
    of its tool is first checked, so a request whose answer calls nothing costs no compile.

    A call of a tool the request does not declare is rejected with reason `unknown_tool`, as the
    gateway's executor rejects a call of a tool outside its registry, in the same words: the model
    can only have seen the tools the request offered it, and those of the gateway, whose calls
    never come here."""

    def __init__(self, tools: object, cache: SchemaCache, *, max_schema_bytes: int = MAX_SCHEMA_BYTES,
                 max_tools: int = MAX_TOOLS) -> None:
        self._cache = cache
        self._max_bytes = max_schema_bytes
        self._declared: dict[str, _Declared] = {}
        self._ready: dict[str, CompiledSchema | Unchecked] = {}
        functions = 0
        for item in tools if isinstance(tools, list | tuple) else ():
            found = _declaration(item)
            if found is None or found[0] in self._declared:
                continue  # nameless, or a name declared twice: the first declaration counts
            name, schema, is_function = found
            functions += is_function
            why: Unchecked | None = (None if is_function and functions <= max_tools
                                     else "too_many_tools" if is_function else "not_a_function")
            self._declared[name] = _Declared(schema, why)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._declared)

    def check(self, name: str, arguments: str | None) -> ClientCheck:
        """The parse step of one call of tool `name` with `arguments` (the model's JSON text), all
        on the calling thread: what check_bounded does, for a caller that may block (the bench)."""
        checked = self._inline(name, arguments)
        if not isinstance(checked, _PastInline):
            return checked
        return self._kept(name, self._off_loop_job(name, arguments)())

    async def check_bounded(self, name: str, arguments: str | None, threads: ToolThreads) -> ClientCheck:
        """The same on the event loop: within the INLINE budget there, and a check past it done
        again on one of `threads` within the OFF_LOOP budget (`too_complex` past that, or when no
        thread is free in time)."""
        checked = self._inline(name, arguments)
        if not isinstance(checked, _PastInline):
            return checked
        try:
            async with asyncio.timeout(OFF_LOOP.seconds + THREAD_GRACE_SECONDS):
                done = await threads.run(self._off_loop_job(name, arguments))
        except (TimeoutError, ToolsBusy):
            return TOO_COMPLEX
        return self._kept(name, done)

    def _off_loop_job(self, name: str, arguments: str | None) -> Callable[[], _Done]:
        ready = self._ready.get(name)
        schema = self._declared[name].schema if ready is None else ready
        return functools.partial(_check_fully, name, arguments, schema, self._cache.formats, OFF_LOOP,
                                 time.monotonic())

    def _kept(self, name: str, done: _Done) -> ClientCheck:
        """The check made off the loop, the schema it compiled kept as one compiled on the loop is."""
        compiled, checked = done
        if name not in self._ready:
            self._ready[name] = compiled
            self._cache.add(orjson.dumps(self._declared[name].schema), compiled)
        return checked

    def _inline(self, name: str, arguments: str | None) -> ClientCheck | _PastInline:
        declared = self._declared.get(name) if isinstance(name, str) else None
        if declared is None:
            return ClientCheck("rejected", refusal(str(name), list(self._declared)))
        if declared.unchecked is not None:
            return ClientCheck("unchecked", unchecked=declared.unchecked)
        long = isinstance(arguments, str) and len(arguments) > MAX_INLINE_ARGUMENTS
        if long and _values_at_most(str(arguments)) > MAX_CHECKED_VALUES:
            return TOO_COMPLEX
        ready = self._ready.get(name)
        if ready is None:
            compiled = self._compile(declared.schema)
            if isinstance(compiled, _PastInline):
                return compiled
            ready = self._ready[name] = compiled
        if isinstance(ready, str):
            return ClientCheck("unchecked", unchecked=ready)
        if long:
            return PAST_INLINE  # reading them alone would take much of the inline budget
        with metered(INLINE):
            try:
                return _check(name, arguments if isinstance(arguments, str) else None, ready)
            except OverBudget:
                return PAST_INLINE

    def _compile(self, schema: Any) -> CompiledSchema | Unchecked | _PastInline:
        try:
            encoded = orjson.dumps(schema)
        except orjson.JSONEncodeError:  # too deep, or an integer past 64 bits (not from a request orjson read)
            return "invalid_schema"
        if len(encoded) > self._max_bytes:
            return "schema_too_large"
        return self._cache.compiled(encoded, schema)


def _values_at_most(text: str) -> int:
    """At least as many as the JSON values `text` holds (each value but the first follows a comma
    or opens an array or object; commas inside strings count too)."""
    return text.count(",") + text.count("[") + text.count("{") + 1


_Done = tuple[CompiledSchema | Unchecked, ClientCheck]  # a check off the loop: what it compiled, and the check


def _check_fully(name: str, arguments: str | None, schema: Any, formats: FormatChecker, budget: Budget,
                 started: float) -> _Done:
    """Off the event loop: `schema` compiled (unless it is already) and the call checked, within
    `budget` from `started`; what was compiled, for the cache, and the check."""
    with metered(budget, started):
        try:
            compiled = schema if isinstance(schema, CompiledSchema) else compile_schema(schema, formats)
        except OverBudget:
            return "too_complex", TOO_COMPLEX
        if isinstance(compiled, str):
            return compiled, ClientCheck("unchecked", unchecked=compiled)
        try:
            return compiled, _check(name, arguments if isinstance(arguments, str) else None, compiled)
        except OverBudget:
            return compiled, TOO_COMPLEX


def _declaration(item: object) -> tuple[str, Any, bool] | None:
    """(name, parameters schema, whether it is a function tool) of one declared tool, or None."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    inner = item.get("function")
    if kind == "function" and isinstance(inner, dict):  # Chat Completions
        name, schema = inner.get("name"), inner.get("parameters")
    elif kind == "function":  # Responses
        name, schema = item.get("name"), item.get("parameters")
    elif kind in (None, "custom") and "input_schema" in item:  # Anthropic Messages
        name, schema = item.get("name"), item.get("input_schema")
    else:  # a tool of another kind (Chat's custom tools, Responses' built-in ones): names only
        nested = item.get(kind) if isinstance(kind, str) else None
        name = item.get("name", nested.get("name") if isinstance(nested, dict) else None)
        return (name, None, False) if isinstance(name, str) else None
    if not isinstance(name, str):
        return None
    return name, {"type": "object", "properties": {}} if schema is None else schema, True  # None: no arguments


def _check(tool: str, arguments: str | None, compiled: CompiledSchema) -> ClientCheck:
    """Tool._validate_values's step (the one MCP tools take), for a schema the client declared."""
    decoded = read_arguments(tool, arguments)
    if isinstance(decoded, Rejection):
        return ClientCheck("rejected", decoded)
    check = compiled.names_of(decoded)
    problems = value_problems(compiled.validator, decoded, check)
    refuse_unrecognized = bool(check.unrecognized) and compiled.closed
    if not (problems or check.missing or refuse_unrecognized):
        return ClientCheck("ok", arguments=decoded)  # read once: the guardrails take them from here
    reason: RejectionReason = "missing_arguments" if check.missing else "schema_violation"
    return ClientCheck("rejected", Rejection(reason, describe_problems(tool, check, problems, refuse_unrecognized),
                                             check))

