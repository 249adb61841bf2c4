"""Raw tool arguments, and messages about them, made safe to put on a span: secrets masked,
length bounded; and what the check of their names found, as a span says it.

A key is secret when it contains one of the redact keys, in any letter case, `-` and `_` counting
as the same character (`X-Api-Key` matches `api_key`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from gateway.tools.arguments import MAX_ARGUMENT_DEPTH
from gateway.wire.json_depth import nests_deeper

MASK = "[REDACTED]"
_HUNTED_MIN = 4  # a shorter secret value is not searched for in free text: it would mask half of it
_HUNTED_MAX = 64  # secret values searched for in one message, at most
# What stands for decoded JSON nested too deep to write as text again (past what json.dumps can do).
TOO_DEEP = f"[nested more than {MAX_ARGUMENT_DEPTH} levels deep]"


def _normal(key: str) -> str:
    return key.lower().replace("-", "_")


def _secret(key: str, keys: Sequence[str]) -> bool:
    low = _normal(key)
    return any(k in low for k in keys)


def secret_aliases(alias_of: Mapping[str, str], keys: Sequence[str]) -> Sequence[str]:
    """`keys` and the aliases of the parameters they name secret (`pwd` for a `password`), normalised
    as keys are: a value sent under such an alias is as secret as under the parameter's own name."""
    if not alias_of:
        return keys
    extra = tuple(_normal(alias) for alias, name in alias_of.items() if _secret(name, keys))
    return (*keys, *extra) if extra else keys


def _mask(value: Any, keys: Sequence[str]) -> Any:
    if isinstance(value, dict):
        return {k: MASK if _secret(str(k), keys) else _mask(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, keys) for v in value]
    return value


@lru_cache(maxsize=16)
def _secret_keys(keys: tuple[str, ...], loose: bool) -> re.Pattern[str]:
    """A quoted key naming a secret, then `:` or `=`; `loose`, for arguments, also takes a bare
    key (`key: value`, `key=value`)."""
    names = "|".join(re.escape(k).replace("_", "[-_]") for k in keys)
    key = rf'"[^"\n]*(?:{names})[^"\n]*"|\'[^\'\n]*(?:{names})[^\'\n]*\''
    if loose:
        key += rf"|(?<![\w\"'.-])[\w.-]*(?:{names})[\w.-]*"
    return re.compile(rf"(?:{key})\s*[:=]\s*", re.IGNORECASE)


_BARE_VALUE = re.compile(r"[^,;&}\]\s]+")


def _string_end(text: str, start: int) -> int:
    """Where the string quoted at `start` ends (after its closing quote), or the end of the text."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    return len(text)


def _nested_end(text: str, start: int) -> int:
    """Where the object or array opened at `start` closes, or the end of the text."""
    depth, i = 0, start
    while i < len(text):
        if text[i] in "\"'":
            i = _string_end(text, i)
            continue
        depth += 1 if text[i] in "{[" else -1 if text[i] in "}]" else 0
        i += 1
        if depth == 0:
            return i
    return len(text)


def _value_end(text: str, start: int, loose: bool) -> int | None:
    """Where the value at `start` ends: a quoted string, an object or array, or (`loose`) a bare
    word up to a delimiter. None when there is no such value there."""
    if start >= len(text):
        return None
    if text[start] in "\"'":
        return _string_end(text, start)
    if text[start] in "{[":
        return _nested_end(text, start)
    bare = _BARE_VALUE.match(text, start) if loose else None
    return bare.end() if bare is not None else None


def _closes_a_string(text: str, start: int, position: int) -> bool:
    """Whether the quote at `position` closes a string that opened after `start` (a place
    outside any string): then it cannot open a quoted key."""
    i = start
    while i < position:
        if text[i] in "\"'":
            end = _string_end(text, i)
            if end > position:
                return end == position + 1
            i = end
        else:
            i += 1
    return False


def _mask_text(raw: str, keys: Sequence[str], loose: bool = True) -> str:
    """Best effort for text that is not a JSON object: mask the values of the secret pairs we can
    see. Free text (a message, not `loose`) needs the key quoted and the value quoted or nested:
    `Tool 'reset_password': required ...` is no pair."""
    if not keys:
        return raw
    pattern, parts, at, search_at = _secret_keys(tuple(keys), loose), [], 0, 0
    while (match := pattern.search(raw, search_at)) is not None:
        if _closes_a_string(raw, at, match.start()):  # `'x', "password": v`: no key starts at x's end
            search_at = match.start() + 1
            continue
        end = _value_end(raw, match.end(), loose)
        if end is None:
            parts.append(raw[at:match.end()])
        else:
            quote = raw[match.end()] if raw[match.end()] in "\"'" else ""
            parts += [raw[at:match.end()], quote, MASK, quote]
        at = search_at = end if end is not None else match.end()
    parts.append(raw[at:])
    return "".join(parts)


def too_deep(value: Any) -> bool:
    """Whether decoded JSON nests deeper than the gateway takes arguments (MAX_ARGUMENT_DEPTH): a
    call it refused, recorded as sent. Such a value is kept as text: walking it recursively (to mask
    it, to write it out) would exhaust the interpreter's stack."""
    return isinstance(value, dict | list) and nests_deeper(value, MAX_ARGUMENT_DEPTH)


def masked(value: Any, redact_keys: Sequence[str]) -> Any:
    """Decoded JSON (or text) with the values under secret keys masked, as `render_arguments` masks;
    a value nested too deep (`too_deep`) comes back as its JSON text, masked as text."""
    keys = [_normal(k) for k in redact_keys]
    if too_deep(value):
        try:
            value = json.dumps(value, ensure_ascii=False)
        except RecursionError:
            return TOO_DEEP
    if not keys:
        return value
    return _mask_text(value, keys) if isinstance(value, str) else _mask(value, keys)


# The keywords of a JSON Schema that hold values rather than structure.
_SCHEMA_VALUES = frozenset({"default", "const", "enum", "examples", "example"})
# The keywords whose value maps names (a property's, a definition's) to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_DEFINITIONS = ("$defs", "definitions")  # the maps of a schema's definitions, that a local `$ref` names
# Levels of a schema walked to mask it: a subschema deeper than any declaration needs is masked
# whole, and the walk stays well within the interpreter's stack.
_SCHEMA_DEPTH = 2 * MAX_ARGUMENT_DEPTH


def _masked_schema(schema: Any, keys: Sequence[str], secret: bool = False, depth: int = 0,
                   refs: set[str] | None = None) -> Any:
    """`schema` with its values masked where `secret` (under a secret property), its structure kept;
    the references (`$ref`) met where `secret` are added to `refs`."""
    if depth > _SCHEMA_DEPTH:
        return MASK
    if isinstance(schema, list):
        return [_masked_schema(item, keys, secret, depth + 1, refs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_VALUES:  # values, not schemas: as they are, but a secret property's
            out[key] = MASK if secret else value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _masked_schema(sub, keys, secret or (key == "properties" and _secret(str(name), keys)),
                                             depth + 2, refs) for name, sub in value.items()}
        else:
            if key == "$ref" and secret and refs is not None and isinstance(value, str):
                refs.add(value)
            out[key] = _masked_schema(value, keys, secret, depth + 1, refs)
    return out


def _definition(ref: str) -> tuple[str, str] | None:
    """Where a local reference to one of the root's definitions points (`#/$defs/Name`, as pydantic
    writes them, or `#/definitions/Name`): the map and the name; None for any other reference."""
    where, _, name = ref.removeprefix("#/").partition("/")
    if not ref.startswith("#/") or where not in _DEFINITIONS or not name or "/" in name:
        return None
    return where, name.replace("~1", "/").replace("~0", "~")


def _mask_referred(schema: dict[str, Any], out: dict[str, Any], keys: Sequence[str], refs: set[str]) -> None:
    """In `out` (the masked `schema`), the root's definitions that a secret property refers to
    (a pydantic enum: `{"$ref": "#/$defs/Token"}`), and those they refer to in turn, masked as the
    property is. Each definition is walked once more at most: the work stays within twice the walk."""
    pending, done = list(refs), set()
    while pending:
        ref = pending.pop()
        found = _definition(ref)
        if ref in done or found is None:
            continue
        done.add(ref)
        where, name = found
        definitions = schema.get(where)
        if isinstance(definitions, dict) and name in definitions and isinstance(out.get(where), dict):
            more: set[str] = set()
            out[where][name] = _masked_schema(definitions[name], keys, True, 2, more)
            pending.extend(more - done)


def masked_schema(schema: Any, redact_keys: Sequence[str]) -> Any:
    """A JSON Schema (a tool's parameters) with the values it gives a secret property masked: its
    default, const, enum and examples, and those anywhere in its subschemas (anyOf, items, its own
    properties ...), the root's definitions it refers to included (`$defs`, `definitions`). Its
    structure stays, so that a `password` parameter is still declared as it was; a subschema nested
    past _SCHEMA_DEPTH levels is masked whole."""
    keys = [_normal(k) for k in redact_keys]
    if not keys:
        return schema
    refs: set[str] = set()
    out = _masked_schema(schema, keys, refs=refs)
    if refs and isinstance(schema, dict):
        _mask_referred(schema, out, keys, refs)
    return out


def mask_text(text: str, redact_keys: Sequence[str]) -> str:
    """Free text (a message's content) with its quoted secret pairs masked (`"api_key": "..."`)."""
    keys = [_normal(k) for k in redact_keys]
    return _mask_text(text, keys, loose=False) if keys else text


_CUT = re.compile(r"\.\.\.\[truncated; [0-9]+ chars sent\]\Z")


def was_cut(rendered: str) -> bool:
    """Whether `rendered` (what `render_arguments` made) is the start of longer arguments only."""
    return _CUT.search(rendered) is not None


def was_masked(rendered: str) -> bool:
    """Whether `rendered` may hold a masked value: the mask stands where a value was."""
    return MASK in rendered


def render_arguments(raw: str, max_chars: int, redact_keys: Sequence[str]) -> str:
    """`raw` with values under keys containing any of `redact_keys` masked, cut to `max_chars`."""
    keys = [_normal(k) for k in redact_keys]
    if len(raw) > 16 * max_chars:
        text = _mask_text(raw[: 2 * max_chars], keys)  # too long to decode on every rejection
    else:
        try:
            decoded = json.loads(raw)
        except (ValueError, RecursionError):
            decoded = None
        if keys and isinstance(decoded, dict | list) and not too_deep(decoded):
            text = json.dumps(_mask(decoded, keys), ensure_ascii=False)
        else:  # not JSON, or a JSON string or number, which may hold JSON text of its own
            text = _mask_text(raw, keys)
    if len(text) > max_chars:
        return text[:max_chars] + f"...[truncated; {len(raw)} chars sent]"
    return text


# A line of the message an `args_model` rejection gives the model (gateway.tools.function):
# `- <field.path>: <what is wrong> (got <the value sent, as JSON, maybe cut>)`. Read by splitting,
# not by a pattern: the text may echo what the model sent, and a backtracking pattern over a long
# crafted line would hold the event loop.
_VALUE_SENT = " (got "


def _masked_violation(line: str, keys: Sequence[str]) -> str:
    """A rejection line whose field path names a secret, with the value it quotes masked."""
    if not (line.startswith("- ") and line.endswith(")")) or _VALUE_SENT not in line:
        return line
    where, found, problem = line[2:].partition(": ")
    what, sent, _ = problem.partition(_VALUE_SENT)  # the first: the value may hold the marker too
    if not (found and sent) or not any(_secret(part, keys) for part in where.split(".")):
        return line
    return f"- {where}: {what}{_VALUE_SENT}{MASK})"


def _secret_values(value: Any, keys: Sequence[str]) -> Iterator[Any]:
    """The scalars under secret-named keys, at any depth, in the order they are written. Walked
    without recursion: arguments nested too deep for the gateway (too_deep) are hunted through too."""
    pending: list[tuple[Any, bool]] = [(value, False)]
    while pending:
        item, under_secret = pending.pop()
        if isinstance(item, dict):
            pending.extend(reversed([(v, under_secret or _secret(str(k), keys)) for k, v in item.items()]))
        elif isinstance(item, list):
            pending.extend(reversed([(v, under_secret) for v in item]))
        elif under_secret and isinstance(item, str | int | float) and not isinstance(item, bool):
            yield item


def _hunted(raw: str, keys: Sequence[str], max_chars: int) -> list[str]:
    """The secret values of JSON arguments, as a message might quote them (as they are, or
    JSON-escaped), longest first."""
    if len(raw) > 16 * max_chars:
        return []  # as in render_arguments: too long to decode on every failure
    try:
        decoded = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    forms: set[str] = set()
    for value in _secret_values(decoded, keys):
        text = value if isinstance(value, str) else json.dumps(value)
        forms.update((text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]))
        if len(forms) >= 3 * _HUNTED_MAX:
            break
    return sorted((f for f in forms if len(f) >= _HUNTED_MIN), key=len, reverse=True)


def mask_message(message: str, raw_arguments: str, redact_keys: Sequence[str], max_chars: int) -> str:
    """A message about a call (a span's status description) with the secrets of its arguments
    masked: the value of a rejection line about a secret field, quoted secret pairs, and the
    secret values of the arguments wherever the message quotes them. The model's own copy of
    the message is left alone: it sent those values."""
    keys = [_normal(k) for k in redact_keys]
    if not keys:
        return message

    lines = "\n".join(_masked_violation(line, keys) for line in message.split("\n"))
    text = _mask_text(lines, keys, loose=False)
    for secret in _hunted(raw_arguments, keys, max_chars):
        text = text.replace(secret, MASK)
    return text
