"""Rebuilds bfcl.jsonl from a checkout of ShishirPatil/gorilla (see README.md here):
python tests/corpus/function_schemas/extract_bfcl.py GORILLA_CHECKOUT > tests/corpus/function_schemas/bfcl.jsonl"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATA = "berkeley-function-call-leaderboard/bfcl_eval/data"
# The user-contributed ("live") categories and the multi-turn APIs' declarations.
SOURCES = ("BFCL_v4_live_*.json", "multi_turn_func_doc/*.json")
# BFCL writes Python's and Java's type names; JSON Schema's are these. "any" and unknown: no type.
TYPES = {
    "dict": "object", "HashMap": "object", "object": "object",
    "float": "number", "double": "number", "number": "number",
    "integer": "integer", "long": "integer",
    "tuple": "array", "array": "array", "Array": "array", "ArrayList": "array",
    "string": "string", "String": "string", "char": "string",
    "boolean": "boolean", "Boolean": "boolean",
}


def schema(declared: Any) -> dict[str, Any]:
    """The checkable part of one BFCL schema: types, enums, items, properties and required."""
    if not isinstance(declared, dict):
        return {}
    out: dict[str, Any] = {}
    if (kind := TYPES.get(str(declared.get("type")))) is not None:
        out["type"] = kind
    if isinstance(declared.get("enum"), list) and declared["enum"]:
        out["enum"] = declared["enum"]
    if isinstance(declared.get("items"), dict):
        out["items"] = schema(declared["items"])
    props = declared.get("properties")
    if isinstance(props, dict) and props:
        out["properties"] = {str(name): schema(sub) for name, sub in props.items()}
        required = [name for name in declared.get("required", []) if name in props]
        if required:
            out["required"] = required
    return out


def functions(path: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            found.extend(entry.get("function", [entry]))
    return found


def main(checkout: Path) -> None:
    seen: set[tuple[str, ...]] = set()  # a function by its name and parameter names: the first kept
    for pattern in SOURCES:
        for path in sorted((checkout / DATA).glob(pattern)):
            for function in functions(path):
                parameters = schema(function.get("parameters"))
                if not parameters.get("properties"):
                    continue
                parameters["type"] = "object"
                key = (function["name"], *sorted(parameters["properties"]))
                if key not in seen:
                    seen.add(key)
                    print(json.dumps({"name": function["name"], "parameters": parameters}, separators=(",", ":")))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
