"""Strict tools: the schema OpenAI's strict mode accepts, made from any declaration.

Function calling's strict mode is Structured Outputs applied to the parameters
(https://platform.openai.com/docs/guides/function-calling#strict-mode), so the rules are those of
https://platform.openai.com/docs/guides/structured-outputs#supported-schemas:
- every object sets `additionalProperties: false` and lists every property in `required`; an
  optional property is emulated "by using a union type with null";
- the root is an object, not `anyOf`;
- only the listed types and keywords; `$defs`/`$ref` (recursion included) are supported, the
  composition keywords `allOf`, `not`, `dependentRequired`, `dependentSchemas`, `if`, `then`,
  `else` are not;
- at most 5000 object properties, 10 levels of nesting, 1000 enum values, 120,000 characters of
  property names, definition names, enum and const values, and 15,000 characters of values in
  one string enum of more than 250 values.
A declaration these rules cannot express fails when the tool is built, naming the place and why.
The page adds that fine-tuned models support none of the string, number and array constraints;
they are kept, since every other model does.

Since a strict model sends every property, it sends null for an optional one it means to leave
out; the parse step of a strict tool reads that null as "not sent" (gateway.tools.strict_nulls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from gateway.tools.params import ToolDeclarationError

DOCS = "https://platform.openai.com/docs/guides/structured-outputs#supported-schemas"

# The types and keywords the supported-schemas page lists; `type` may also be a list with "null".
SUPPORTED_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
SUPPORTED_KEYWORDS = frozenset({
    "type", "description", "enum", "const", "anyOf", "$ref", "properties", "required", "additionalProperties",
    "items",
    "pattern", "format",  # strings
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",  # numbers
    "minItems", "maxItems",  # arrays
})
SUPPORTED_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
# Annotations describe values and never decide which are valid, so dropping them keeps the
# declaration's meaning. (`format` with an unlisted value is dropped for the same reason: JSON
# Schema 2020-12 makes `format` an annotation unless a validator opts in. `default` still holds:
# the parse step applies it when a null is read as "not sent".)
ANNOTATIONS = frozenset({
    "title", "default", "examples", "$comment", "$schema", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "discriminator",
})
# Value checks the page does not list. (Its fine-tuning note names minLength and maxLength among
# what fine-tuned models "additionally" lack, but the supported list omits them, so they count as
# unsupported.) Dropping one would let the model send values the declaration forbids, so they are
# dropped only when the parse step checks them anyway (pydantic), and refused otherwise.
CHECKED_BY_PYDANTIC = frozenset({"minLength", "maxLength", "uniqueItems", "minProperties", "maxProperties"})

MAX_PROPERTIES = 5000
MAX_NESTING = 10  # object levels, the root object included; the page does not say how it counts
MAX_ENUM_VALUES = 1000
MAX_NAME_AND_VALUE_CHARS = 120_000
LARGE_ENUM = 250
MAX_LARGE_ENUM_CHARS = 15_000
NULL: dict[str, Any] = {"type": "null"}


def strict_schema(tool: str, declared: Mapping[str, Any], *, validated: bool) -> dict[str, Any]:
    """The strict-mode form of `declared`, a tool's arguments schema. `validated`: the parse step
    checks values against the declaration itself (args_model, @tool), so value checks strict mode
    lacks can be left to it. Raises ToolDeclarationError naming `tool` when no form exists."""
    converted = _Converter(tool, declared, validated).root()
    _check_limits(tool, converted)
    return converted


def _without(schema: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in keys}


def _place(path: str) -> str:
    return f"parameter {path!r}" if path else "the arguments object"


class _Converter:
    """One declaration's conversion. Paths name places the way a tool author reads them:
    `filter.limit`, `rows[].id`, `$defs/Address.unit`."""

    def __init__(self, tool: str, declared: Mapping[str, Any], validated: bool) -> None:
        self.tool = tool
        self.declared = declared
        self.validated = validated
        defs = declared.get("$defs", {})
        self.defs: Mapping[str, Any] = defs if isinstance(defs, Mapping) else {}
        self.inlining: list[str] = []  # $refs being copied in, outermost first

    def refuse(self, path: str, why: str) -> NoReturn:
        raise ToolDeclarationError(f"tool {self.tool!r} cannot be strict: {_place(path)} {why}")

    def root(self) -> dict[str, Any]:
        if "$defs" in self.declared and not isinstance(self.declared["$defs"], Mapping):
            self.refuse("", "has a $defs that is not an object")
        body = _without(self.declared, "$defs")
        if "$ref" in body:  # pydantic makes a recursive model its own definition and points at it
            body = {**self.target(body["$ref"], ""), **_without(body, "$ref")}
        if "anyOf" in body or "oneOf" in body or body.get("type") != "object":
            self.refuse("", "must be a plain object, not a union (strict mode's rule for the root)")
        out = self.node(body, "", root=True)
        if self.defs:
            out["$defs"] = {name: self.node(sub, f"$defs/{name}") for name, sub in self.defs.items()}
        return out

    def target(self, ref: Any, path: str) -> Mapping[str, Any]:
        """What a $ref points at; only `#` and `#/$defs/<name>` exist in a tool's schema."""
        if ref == "#":
            return _without(self.declared, "$defs")
        name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else None
        if name is None or name == ref or not isinstance(self.defs.get(name), Mapping):
            self.refuse(path, f"refers to {ref!r}, which is not one of its own $defs")
        found: Mapping[str, Any] = self.defs[name]
        return found

    def node(self, schema: Any, path: str, *, root: bool = False) -> dict[str, Any]:
        if not isinstance(schema, Mapping):
            self.refuse(path, "is not a JSON schema object")
        kept = self.keywords(self.unwrap(schema, path), path)
        if "$ref" in kept:
            return self.reference(kept, path)
        if "anyOf" in kept:
            kept["anyOf"] = self.options(kept["anyOf"], path)
        types = self.types(kept, path)
        if "object" in types:
            kept.update(self.object(kept, path, root))
        if "array" in types:
            if not isinstance(kept.get("items"), Mapping):
                self.refuse(path, "is an array without one item schema; strict mode needs to know the items")
            kept["items"] = self.node(kept["items"], f"{path}[]")
        return kept

    def unwrap(self, schema: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """The two compositions with a supported equivalent, rewritten to it."""
        if "allOf" in schema:
            parts = schema["allOf"]
            if not (isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], Mapping)):
                self.refuse(path, f"combines schemas with 'allOf', which strict mode does not support ({DOCS})")
            schema = {**parts[0], **_without(schema, "allOf")}  # the outer keywords describe this place
        if "oneOf" in schema:
            if "discriminator" not in schema:
                self.refuse(path, "uses 'oneOf', which strict mode does not support; use 'anyOf' "
                                  "if the options cannot overlap")
            # pydantic's tagged unions: the tag keeps the options apart, so anyOf means the same
            schema = {**_without(schema, "oneOf"), "anyOf": schema["oneOf"]}
        return schema

    def keywords(self, schema: Mapping[str, Any], path: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in schema.items():
            if key in ANNOTATIONS or (key == "format" and value not in SUPPORTED_FORMATS):
                continue
            if key in CHECKED_BY_PYDANTIC and self.validated:
                continue
            if key in CHECKED_BY_PYDANTIC:
                self.refuse(path, f"uses {key!r}, which strict mode does not support and nothing else would "
                                  "check: drop it, check it in the tool, or declare the tool with strict=False")
            if key not in SUPPORTED_KEYWORDS:
                self.refuse(path, f"uses {key!r}, which strict mode does not support ({DOCS})")
            kept[key] = value
        return kept

    def reference(self, kept: dict[str, Any], path: str) -> dict[str, Any]:
        ref = kept["$ref"]
        found = self.target(ref, path)
        siblings = _without(kept, "$ref")
        if not siblings or ref in self.inlining:  # a definition inside itself keeps the bare $ref
            return {"$ref": ref}
        # Strict mode takes a $ref alone, so a described one gets a copy of its definition (as
        # openai-python's own helper does: openai/lib/_pydantic.py, to_strict_json_schema).
        self.inlining.append(ref)
        try:
            return self.node({**found, **siblings}, path)
        finally:
            self.inlining.pop()

    def options(self, options: Any, path: str) -> list[dict[str, Any]]:
        if not isinstance(options, list) or not options:
            self.refuse(path, "has an 'anyOf' that is not a non-empty list of schemas")
        return [self.node(option, f"{path} (option {i})") for i, option in enumerate(options, 1)]

    def types(self, kept: Mapping[str, Any], path: str) -> list[str]:
        declared = kept.get("type")
        types = [declared] if isinstance(declared, str) else declared
        if declared is None and not {"enum", "const", "anyOf"} & kept.keys():
            self.refuse(path, "declares no type, so it takes any value; strict mode needs a type")
        if declared is not None and not (isinstance(types, list) and set(types) <= SUPPORTED_TYPES):
            self.refuse(path, f"has type {declared!r}; strict mode knows {sorted(SUPPORTED_TYPES)}")
        return list(types or [])

    def object(self, kept: Mapping[str, Any], path: str, root: bool) -> dict[str, Any]:
        if kept.get("additionalProperties", False) is not False:
            self.refuse(path, "takes undeclared keys (additionalProperties), as a free-form dict does; strict "
                              "mode requires additionalProperties: false, so declare every key as a property")
        properties = kept.get("properties")
        if not isinstance(properties, Mapping) or not (properties or root):
            self.refuse(path, "declares no properties (a free-form dict); strict mode fills in declared "
                              "properties only, so declare them")
        required = kept.get("required", [])
        if not isinstance(required, list) or not set(required) <= set(properties):
            self.refuse(path, f"has a 'required' list ({required!r}) that is not a list of its declared properties")
        converted = {}
        for name, sub in properties.items():
            prop = self.node(sub, f"{path}.{name}" if path else str(name))
            converted[name] = prop if name in required else nullable(prop)
        return {"properties": converted, "required": list(converted), "additionalProperties": False}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` accepting null too: strict mode's way of saying "optional". A plain type gets
    "null" in its type list; anything richer (enum, object, array, $ref) becomes an anyOf."""
    if accepts_null(schema, lambda ref: None):
        return schema
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], NULL]}
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
    plain = types is not None and not {"object", "array"} & set(types)
    if plain and not {"enum", "const"} & schema.keys():
        return {**schema, "type": [*(types or []), "null"]}
    return {"anyOf": [schema, NULL]}


Resolver = Callable[[str], "Mapping[str, Any] | None"]


def accepts_null(schema: Mapping[str, Any], resolve: Resolver, seen: frozenset[str] = frozenset()) -> bool:
    """Whether `schema` accepts null; `resolve` finds what a $ref points at (None: do not follow)."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        found = None if ref in seen else resolve(ref)
        return found is not None and accepts_null(found, resolve, seen | {ref})
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if None in (schema.get("enum") or ()) or ("const" in schema and schema["const"] is None):
        return True
    options = [*(schema.get("anyOf") or ()), *(schema.get("oneOf") or ()), *(schema.get("allOf") or ())[:1]]
    return any(isinstance(option, Mapping) and accepts_null(option, resolve, seen) for option in options)


# --- size limits ----------------------------------------------------------------------------------


@dataclass
class _Tally:
    properties: int = 0
    enum_values: int = 0
    chars: int = 0  # property names, definition names, enum values and const values


def _check_limits(tool: str, schema: Mapping[str, Any]) -> None:
    def refuse(why: str) -> NoReturn:
        raise ToolDeclarationError(f"tool {tool!r} cannot be strict: {why} ({DOCS})")

    tally = _Tally(chars=sum(len(name) for name in schema.get("$defs", {})))
    for node in _document_nodes(schema):
        properties = node.get("properties", {})
        tally.properties += len(properties)
        tally.chars += sum(len(name) for name in properties)
        values = node.get("enum") or []
        tally.enum_values += len(values)
        enum_chars = sum(len(v) for v in values if isinstance(v, str))
        if len(values) > LARGE_ENUM and enum_chars > MAX_LARGE_ENUM_CHARS:
            refuse(f"an enum of {len(values)} values holds {enum_chars} characters; over {LARGE_ENUM} values, "
                   f"strict mode allows {MAX_LARGE_ENUM_CHARS}")
        tally.chars += enum_chars + (len(node["const"]) if isinstance(node.get("const"), str) else 0)
    if tally.properties > MAX_PROPERTIES:
        refuse(f"it declares {tally.properties} object properties; strict mode allows {MAX_PROPERTIES}")
    if tally.enum_values > MAX_ENUM_VALUES:
        refuse(f"its enums hold {tally.enum_values} values; strict mode allows {MAX_ENUM_VALUES}")
    if tally.chars > MAX_NAME_AND_VALUE_CHARS:
        refuse(f"its names, enum and const values run to {tally.chars} characters; strict mode allows "
               f"{MAX_NAME_AND_VALUE_CHARS}")
    depth = _nesting(schema, schema, (), {})
    if depth > MAX_NESTING:
        refuse(f"its objects nest {depth} levels deep; strict mode allows {MAX_NESTING}")


def _children(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = node.get("items")
    below = [items] if isinstance(items, Mapping) else []
    return [*node.get("properties", {}).values(), *node.get("anyOf", []), *below]


def _document_nodes(schema: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every subschema written in the document, each once."""
    pending = [schema, *schema.get("$defs", {}).values()]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(_children(node))


def _nesting(node: Mapping[str, Any], root: Mapping[str, Any], refs: tuple[str, ...], known: dict[str, int]) -> int:
    """Object levels from `node` down, through $refs; a recursive $ref counts once (the page
    supports recursion, so its depth cannot be what the limit is about)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in refs:
            return 0
        if ref not in known:
            target = root if ref == "#" else root["$defs"][ref.removeprefix("#/$defs/")]
            known[ref] = _nesting(target, root, (*refs, ref), known)
        return known[ref]
    below = max((_nesting(child, root, refs, known) for child in _children(node)), default=0)
    return below + (1 if "properties" in node else 0)
