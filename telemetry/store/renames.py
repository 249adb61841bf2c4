"""The argument names models invent, per tool and per model, and the alias lines that would let
the gateway take them (`tool_aliases` in the settings).

A rename is a name a call sent that its tool does not accept (`toolspan.args.unrecognized`),
with the accepted name the diagnostic suggested for it (`toolspan.args.suggestions`; None when no
accepted name was close). A rename recovered when its call's failure did: a later call of the tool
in the trajectory was ok (`telemetry.store.calls.failure_runs`). A model that keeps sending one
name and recovers each time is paying a round for it; an alias saves that round.

An alias line is suggested only for a rename with a suggestion, of a gateway tool (a client's
tool is the client's to declare), one TOML table a tool, each accepted name with every sent name
that was mapped to it: every line one the gateway starts with (gateway.tools.aliases.alias_table).
A sent name it would refuse is left out of the lines, with a comment saying why: a name suggested
for more than one of the tool's parameters (an alias stands for one), a parameter's own name, one
longer than a name may be, or one no settings file can hold (half a character)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from gateway.tools.params import MAX_NAME_CHARS
from telemetry import names
from telemetry.store.calls import failure_runs
from telemetry.store.rows import suggestions

RENAMES_SHOWN = 50  # the most frequent renames listed, and the ones alias lines are made of
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# What a TOML basic string may not hold as it is (JSON escapes the rest the same way): DEL.
_TOML_UNSAFE = {"\x7f": "\\u007f"}
_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a character: no TOML (nor UTF-8) text holds one

RenameKey = tuple[str, str | None, str | None, str, str | None]  # tool, side, model, name sent, name suggested


def _suggested(call: dict[str, Any]) -> dict[str, str]:
    found = call["suggestions"]
    return found if isinstance(found, dict) else suggestions(found)


def renames_by_model(calls: Sequence[dict[str, Any]], top: int = RENAMES_SHOWN) -> list[dict[str, Any]]:
    """The renames in some calls (with "model" and "turn", in order), the `top` most frequent:
    [{"tool", "side", "model", "from", "to", "count", "recovered"}], "recovered" counting the
    calls whose failure recovered."""
    recovered = {id(call) for failure in failure_runs(calls) if failure.rounds_to_recover is not None
                 for call in failure.calls}
    counts: Counter[RenameKey] = Counter()
    recoveries: Counter[RenameKey] = Counter()
    for call in calls:
        suggested = _suggested(call)
        for name in call["unrecognized"] or ():
            key = (call["tool"], call["side"], call["model"], name, suggested.get(name))
            counts[key] += 1
            recoveries[key] += id(call) in recovered
    ordered = sorted(counts.items(), key=lambda item: (-item[1], _sortable(item[0])))
    return [{"tool": tool, "side": side, "model": model, "from": sent, "to": accepted, "count": n,
             "recovered": recoveries[(tool, side, model, sent, accepted)]}
            for (tool, side, model, sent, accepted), n in ordered[:top]]


def _sortable(key: RenameKey) -> tuple[str, ...]:
    return tuple(part or "" for part in key)


def alias_suggestions(renames: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alias lines for some renames (`renames_by_model`'s), one a gateway tool that has a
    rename with a suggestion, by tool name: [{"tool", "aliases": {accepted: [sent, ...]}, "left_out":
    [{"name", "parameters", "why"}], "toml"}], the sent names most frequent first; "left_out": the
    sent names given no line, by name, with the parameters suggested for them."""
    sent_for: dict[str, dict[str, Counter[str]]] = {}
    for rename in renames:
        if rename["to"] is None or rename["side"] == names.SIDE_CLIENT:
            continue
        sent_for.setdefault(rename["tool"], {}).setdefault(rename["to"], Counter())[rename["from"]] += rename["count"]
    found = []
    for tool in sorted(sent_for):
        left_out = _left_out(sent_for[tool])
        refused = {left["name"] for left in left_out}
        aliases = {accepted: kept for accepted, sent in sorted(sent_for[tool].items())
                   if (kept := [name for name, _ in sorted(sent.items(), key=lambda item: (-item[1], item[0]))
                                if name not in refused])}
        found.append({"tool": tool, "aliases": aliases, "left_out": left_out,
                      "toml": alias_toml(tool, aliases, left_out)})
    return found


def _left_out(sent_for: dict[str, Counter[str]]) -> list[dict[str, Any]]:
    """The sent names of one tool that the gateway would not take as aliases, and why."""
    meant: dict[str, set[str]] = {}
    for accepted, sent in sent_for.items():
        for name in sent:
            meant.setdefault(name, set()).add(accepted)
    left = []
    for name in sorted(meant):
        why = _why_no_alias(name, sorted(meant[name]), sent_for)
        if why is not None:
            left.append({"name": name, "parameters": sorted(meant[name]), "why": why})
    return left


def _why_no_alias(name: str, parameters: list[str], accepted: dict[str, Counter[str]]) -> str | None:
    """Why the gateway would refuse `name` as an alias of `parameters` (None: it would take it)."""
    if _SURROGATE.search(name):
        return "it holds half a character, which no settings file can"
    if not name:
        return "an empty name"
    if len(name) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters, which no name the gateway takes is"
    if name in accepted:
        return "a parameter's own name"
    if len(parameters) > 1:
        return "an alias stands for one parameter"
    return None


def alias_toml(tool: str, aliases: dict[str, list[str]], left_out: Sequence[dict[str, Any]] = ()) -> str:
    """The settings' lines that alias `aliases`' sent names to their accepted names for `tool`, and a
    comment for each name `left_out` (alias_suggestions):
    [tool_aliases.read_file]
    path = ["file_path", "filepath"]
    # no alias for "date" (suggested for "end_date", "start_date"): an alias stands for one parameter"""
    lines = [f"[tool_aliases.{_toml_key(tool)}]"]
    lines += [f"{_toml_key(accepted)} = [{', '.join(_toml_string(name) for name in sent)}]"
              for accepted, sent in aliases.items()]
    lines += [f"# no alias for {_quoted(left['name'])} (suggested for "
              f"{', '.join(_quoted(name) for name in left['parameters'])}): {left['why']}" for left in left_out]
    return "\n".join(lines)


def _quoted(name: str) -> str:
    """A name inside a TOML comment, which ends at a line break: as a basic string, half characters
    escaped too (a comment is text like any other)."""
    return _SURROGATE.sub(lambda half: f"\\u{ord(half.group()):04x}", _toml_string(name))


def _toml_key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _toml_string(name)


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped too."""
    quoted = json.dumps(text, ensure_ascii=False)
    for unsafe, escaped in _TOML_UNSAFE.items():
        quoted = quoted.replace(unsafe, escaped)
    return quoted
