"""Systematic renames of the parameters of real-world function schemas (tests/corpus/function_schemas,
from the Berkeley Function Calling Leaderboard), for measuring the did-you-mean: each parameter of
each function renamed the ways a model renames one (case, snake/camel/kebab, a word dropped or
added, a synonym, a typo), then the call checked as a client tool call is.

    python -m tests.tools.rename_corpus   # from the repo root: the suggestion and repair rates per kind
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.client_tools.check import ClientTools, SchemaCache
from gateway.tools import Rejection, Tool, ToolContext
from gateway.tools.repair import repaired

CORPUS = Path(__file__).parents[1] / "corpus" / "function_schemas" / "bfcl.jsonl"

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Words a model puts in place of the declared one (a synonym or a common shortening).
SYNONYMS = {
    "number": "num", "num": "number", "count": "number", "identifier": "id", "id": "identifier",
    "location": "place", "city": "town", "query": "search", "search": "query", "start": "begin",
    "end": "finish", "message": "text", "text": "content", "content": "body", "amount": "quantity",
    "quantity": "amount", "description": "desc", "maximum": "max", "max": "maximum", "min": "minimum",
    "minimum": "min", "size": "length", "length": "size", "date": "day", "user": "person",
    "name": "title", "type": "kind", "limit": "max", "address": "addr", "directory": "dir",
    "information": "info", "image": "img", "source": "src", "destination": "dest", "file": "document",
}


def words(name: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(name)]


def snake(parts: list[str]) -> str:
    return "_".join(parts)


def camel(parts: list[str]) -> str:
    return parts[0] + "".join(w.capitalize() for w in parts[1:]) if parts else ""


def respell(name: str, parts: list[str]) -> str:
    """`parts` joined the way `name` joins its words."""
    if "_" in name:
        return snake(parts)
    if "-" in name:
        return "-".join(parts)
    return camel(parts)


def _swap(name: str) -> str:
    mid = len(name) // 2
    return name[:mid - 1] + name[mid] + name[mid - 1] + name[mid + 1:]


def _synonym(name: str) -> str:
    parts = words(name)
    for i, word in enumerate(parts):
        if word in SYNONYMS:
            return respell(name, [*parts[:i], SYNONYMS[word], *parts[i + 1:]])
    return name


# Each kind of rename: (name, the function's name) -> the renamed name (the name itself: no rename).
RENAMES: dict[str, Callable[[str, str], str]] = {
    "upper": lambda n, f: n.upper(),
    "capitalized": lambda n, f: n[:1].upper() + n[1:],
    "snake_case": lambda n, f: snake(words(n)),
    "camelCase": lambda n, f: camel(words(n)),
    "PascalCase": lambda n, f: "".join(w.capitalize() for w in words(n)),
    "kebab-case": lambda n, f: "-".join(words(n)),
    "first_word_dropped": lambda n, f: respell(n, words(n)[1:]) if len(words(n)) > 1 else n,
    "last_word_dropped": lambda n, f: respell(n, words(n)[:-1]) if len(words(n)) > 1 else n,
    "prefix_added": lambda n, f: respell(n, [words(f)[-1], *words(n)]) if words(f) and words(n) else n,
    "suffix_added": lambda n, f: respell(n, [*words(n), "value"]),
    "synonym": lambda n, f: _synonym(n),
    "letter_dropped": lambda n, f: n[:len(n) // 2] + n[len(n) // 2 + 1:] if len(n) >= 5 else n,
    "letters_swapped": lambda n, f: _swap(n) if len(n) >= 5 else n,
}


def load() -> list[tuple[str, dict[str, Any]]]:
    lines = CORPUS.read_text().splitlines()
    return [(entry["name"], entry["parameters"]) for entry in map(json.loads, lines)]


def example(schema: Any) -> Any:
    """A value `schema` accepts (the corpus keeps types, enums, items, properties and required)."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: example(props[name]) for name in schema.get("required", [])}
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": []}.get(str(kind), "x")


def wrong_value(schema: Any) -> Any:
    """A value of the wrong type for `schema`, or None when it takes any type."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"string": 1, "integer": "x", "number": "x", "boolean": "x", "array": "x", "object": "x"}.get(str(kind))


@dataclass(frozen=True)
class Rename:
    """One renamed call: `meant` sent as `sent`, the call checked against the function's schema."""

    kind: str
    function: str
    meant: str
    sent: str
    arguments: dict[str, Any]
    suggested: str | None  # what the check suggested for `sent`
    suggestions: tuple[tuple[str, str], ...]  # every (sent, suggested) pair of the check
    rejected: bool
    schema: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # the function's


def valid_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema["properties"]
    return {name: example(props[name]) for name in schema.get("required", [])}


def renames(corpus: list[tuple[str, dict[str, Any]]]) -> Iterator[Rename]:
    """Every rename of every parameter: the required parameters sent (the renamed one under its
    new name), an optional one renamed sent beside them. A rename that gives another accepted
    name, or the name itself, is not a rename and is left out."""
    cache = SchemaCache(size=1)
    for function, schema in corpus:
        tools = ClientTools([{"name": function, "input_schema": schema}], cache)
        accepted = schema["properties"]
        for meant, sub in accepted.items():
            if not meant.isascii():
                continue  # the renames split words of ASCII letters
            for kind, rename in RENAMES.items():
                sent = rename(meant, function)
                if not sent or sent in accepted:
                    continue
                arguments = valid_arguments(schema)
                arguments.pop(meant, None)
                arguments[sent] = example(sub)
                check = tools.check(function, json.dumps(arguments))
                hints = dict(check.suggestions)
                yield Rename(kind, function, meant, sent, arguments, hints.get(sent), check.suggestions,
                             check.outcome == "rejected", schema)


def tally(found: list[Rename]) -> dict[str, Counter[str]]:
    """Per kind of rename (and "all"): how many were suggested right, wrong, or not at all."""
    table: dict[str, Counter[str]] = {}
    for rename in found:
        verdict = "none" if rename.suggested is None else "right" if rename.suggested == rename.meant else "wrong"
        for kind in (rename.kind, "all"):
            table.setdefault(kind, Counter())[verdict] += 1
    return table


def repairs(found: list[Rename]) -> dict[str, Counter[str]]:
    """Per kind of rename (and "all"): how many argument repair renamed right, wrong, or left alone
    (gateway.tools.repair, on a gateway tool declaring the function's schema)."""
    tools: dict[int, Tool] = {}  # by the schema (names repeat in the corpus)
    table: dict[str, Counter[str]] = {}

    async def verdict(rename: Rename) -> str:
        tool = tools.get(id(rename.schema))
        if tool is None:
            tool = tools[id(rename.schema)] = Tool(name="f", function=lambda args: args, validate_schema=True,
                                                   parameters_schema=rename.schema)
        context = ToolContext("c")
        parsed = await tool.parse_arguments(rename.arguments, context)
        found = await repaired(tool, rename.arguments, parsed, context, True) if isinstance(parsed, Rejection) else None
        if found is None:
            return "none"
        return "right" if f"rename {rename.sent} -> {rename.meant}" in found[0].changes else "wrong"

    async def run() -> None:
        for rename in found:
            said = await verdict(rename)
            for kind in (rename.kind, "all"):
                table.setdefault(kind, Counter())[said] += 1

    asyncio.run(run())
    return table


def _print(table: dict[str, Counter[str]]) -> None:
    table["all"] = table.pop("all")
    print(f"{'rename':20} {'renames':>8} {'right':>8} {'wrong':>8} {'none':>8}")
    for kind, counts in table.items():
        total = sum(counts.values())
        shares = " ".join(f"{100 * counts[verdict] / total:7.1f}%" for verdict in ("right", "wrong", "none"))
        print(f"{kind:20} {total:8} {shares}")


def main() -> None:
    found = list(renames(load()))
    print("did-you-mean suggestions:")
    _print(tally(found))
    print("\nargument repair (renames made):")
    _print(repairs(found))


if __name__ == "__main__":
    main()
