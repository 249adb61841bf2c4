"""The argument names models invent, per tool and per model, and the alias lines that would let
the gateway take them (`tool_aliases` in the settings).

A rename is a name a call sent that its tool does not accept (`toolspan.args.unrecognized`),
with the accepted name the diagnostic suggested for it (`toolspan.args.suggestions`; None when no
accepted name was close). A rename recovered when its call's failure did: a later call of the tool
in the trajectory was ok (`telemetry.store.calls.failure_runs`). A model that keeps sending one
name and recovers each time is paying a round for it; an alias saves that round.

An alias line is suggested only for a rename with a suggestion, of a gateway tool (a client's
tool is the client's to declare), one TOML table a tool, each accepted name with every sent name
that was mapped to it."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

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
    rename with a suggestion, by tool name: [{"tool", "aliases": {accepted: [sent, ...]}, "toml"}],
    the sent names most frequent first."""
    sent_for: dict[str, dict[str, Counter[str]]] = {}
    for rename in renames:
        if rename["to"] is None or rename["side"] == names.SIDE_CLIENT or _SURROGATE.search(rename["from"]):
            continue
        sent_for.setdefault(rename["tool"], {}).setdefault(rename["to"], Counter())[rename["from"]] += rename["count"]
    found = []
    for tool in sorted(sent_for):
        aliases = {accepted: [name for name, _ in sorted(sent.items(), key=lambda item: (-item[1], item[0]))]
                   for accepted, sent in sorted(sent_for[tool].items())}
        found.append({"tool": tool, "aliases": aliases, "toml": alias_toml(tool, aliases)})
    return found


def alias_toml(tool: str, aliases: dict[str, list[str]]) -> str:
    """The settings' lines that alias `aliases`' sent names to their accepted names for `tool`:
    [tool_aliases.read_file]
    path = ["file_path", "filepath"]"""
    lines = [f"[tool_aliases.{_toml_key(tool)}]"]
    lines += [f"{_toml_key(accepted)} = [{', '.join(_toml_string(name) for name in sent)}]"
              for accepted, sent in aliases.items()]
    return "\n".join(lines)


def _toml_key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _toml_string(name)


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped too."""
    quoted = json.dumps(text, ensure_ascii=False)
    for unsafe, escaped in _TOML_UNSAFE.items():
        quoted = quoted.replace(unsafe, escaped)
    return quoted
