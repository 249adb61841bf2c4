"""Declared parameters: `Param` -> JSON schema, parameter names, and did-you-mean hints."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object"})


class ToolDeclarationError(ValueError):
    """A tool was declared wrongly; raised when the tool is built, naming the tool."""


@dataclass(frozen=True)
class Param:
    """One declared parameter. Objects nest through `properties`; arrays through `item_type`
    (and `properties` when the items are objects)."""

    name: str
    type: str
    description: str | None = None
    required: bool = False
    enum: Sequence[Any] | None = None
    item_type: str | None = None
    properties: Sequence[Param] = field(default_factory=tuple)
    aliases: Sequence[str] = ()  # other names it is accepted under (gateway.tools.aliases); top level only

    def __post_init__(self) -> None:
        # Freeze caller-supplied lists so a Param can be shared safely.
        object.__setattr__(self, "properties", tuple(self.properties))
        object.__setattr__(self, "aliases", (self.aliases,) if isinstance(self.aliases, str) else tuple(self.aliases))
        if self.enum is not None:
            object.__setattr__(self, "enum", tuple(self.enum))

    def check(self, where: str) -> None:
        """Raise ToolDeclarationError when this parameter (or a nested one) is malformed."""
        label = f"{where}: parameter {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ToolDeclarationError(f"{where}: a parameter has an empty or non-string name")
        if self.type not in JSON_TYPES:
            raise ToolDeclarationError(f"{label} has type {self.type!r}; use one of {sorted(JSON_TYPES)}")
        if self.item_type is not None and self.type != "array":
            raise ToolDeclarationError(f"{label} sets item_type but is not an array")
        if self.item_type is not None and self.item_type not in JSON_TYPES:
            raise ToolDeclarationError(f"{label} has item_type {self.item_type!r}; use one of {sorted(JSON_TYPES)}")
        holds_objects = self.type == "object" or self.item_type == "object"
        if self.properties and not holds_objects:
            raise ToolDeclarationError(f"{label} has properties but holds no objects")
        if self.enum is not None and not self.enum:
            raise ToolDeclarationError(f"{label} has an empty enum")
        names = [p.name for p in self.properties]
        if len(names) != len(set(names)):
            raise ToolDeclarationError(f"{label} declares a nested property twice")
        for nested in self.properties:
            if nested.aliases:
                raise ToolDeclarationError(f"{label}: nested property {nested.name!r} has aliases; only top-level "
                                           "parameters take them")
            nested.check(f"{where}.{self.name}")

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.description:
            out["description"] = self.description
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.type == "object":
            out.update(object_schema(self.properties))
        elif self.type == "array" and self.item_type == "object":
            out["items"] = {"type": "object", **object_schema(self.properties)}
        elif self.type == "array" and self.item_type is not None:
            out["items"] = {"type": self.item_type}
        return out


def object_schema(params: Iterable[Param]) -> dict[str, Any]:
    """The `properties`/`required` part of an object schema built from `params`. (A strict tool's
    schema is made from this one by gateway.tools.strict, the same way for every declaration style.)"""
    params = tuple(params)
    return {
        "properties": {p.name: p.schema() for p in params},
        "required": [p.name for p in params if p.required],
    }


def parameters_schema(params: Sequence[Param]) -> dict[str, Any]:
    return {"type": "object", **object_schema(params)}


def schema_names(schema: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(required, accepted) top-level names of an object schema. Accepted is [] when the schema
    does not enumerate its properties, which means "unknown", not "nothing"."""
    props = schema.get("properties")
    accepted = [str(k) for k in props] if isinstance(props, Mapping) else []
    required_raw = schema.get("required")
    required = [str(k) for k in required_raw] if isinstance(required_raw, list) else []
    return required, accepted


# --- did-you-mean ---------------------------------------------------------------------------

_WORD_SPLIT = re.compile(r"[_\-\s.]+|(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[_\-\s.]+")
SIMILARITY_THRESHOLD = 0.7  # the Jaro similarity over which a name is close enough to suggest


def name_words(name: str) -> list[str]:
    """The words of a name, lower case: `pageSize`, `page_size` and `Page-Size` are page, size."""
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


def _folded(name: str) -> str:
    """`name` without case or separators: `pageSize`, `page_size`, `Page-Size` fold alike."""
    return _SEPARATORS.sub("", name).lower()


def jaro(a: str, b: str) -> float:
    """Jaro similarity in [0, 1]."""
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    window = max(max(len(a), len(b)) // 2 - 1, 0)
    a_hit = [False] * len(a)
    b_hit = [False] * len(b)
    matches = 0
    for i, ch in enumerate(a):
        for j in range(max(0, i - window), min(len(b), i + window + 1)):
            if not b_hit[j] and b[j] == ch:
                a_hit[i] = b_hit[j] = True
                matches += 1
                break
    if matches == 0:
        return 0.0
    a_seq = [ch for ch, hit in zip(a, a_hit, strict=True) if hit]
    b_seq = [ch for ch, hit in zip(b, b_hit, strict=True) if hit]
    transpositions = sum(x != y for x, y in zip(a_seq, b_seq, strict=True)) / 2
    return (matches / len(a) + matches / len(b) + (matches - transpositions) / matches) / 3


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether one letter dropped, added or changed, or two neighbours swapped, turn `a` into `b`."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) == 1:
        return any(a == b[:i] + b[i + 1:] for i in range(len(b)))
    if len(a) != len(b):
        return False
    apart = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(apart) == 2 and apart[1] == apart[0] + 1:
        return a[apart[0]] == b[apart[1]] and a[apart[1]] == b[apart[0]]
    return len(apart) == 1


def _run_of_words(short: Sequence[str], long: Sequence[str], *, abbreviated: bool) -> bool:
    """Whether `short` is a run of whole words of `long` (its last word may be the start of one of
    `long`'s when `abbreviated`: `lim` for `limit`, `max_res` for `max_results`)."""
    if not short:
        return False
    for start in range(len(long) - len(short) + 1):
        window = long[start:start + len(short)]
        last, wanted = window[-1], short[-1]
        if window[:-1] == short[:-1] and (last == wanted or (abbreviated and last.startswith(wanted))):
            return True
    return False


@dataclass(frozen=True)
class _Spelling:
    """A name as the did-you-mean compares it, made once per name."""

    name: str
    folded: str
    words: tuple[str, ...]

    @classmethod
    def of(cls, name: str) -> _Spelling:
        return cls(name, _folded(name), tuple(name_words(name)))


Ranked = list[tuple[Any, str]]  # (score, accepted name): the higher the score, the likelier the name


def _respelled(sent: _Spelling, accepted: Sequence[_Spelling]) -> Ranked:
    """The names `sent` is in another case or spelling (`pageSize`, `page-size` for `page_size`)."""
    return [(1, other.name) for other in accepted if other.folded == sent.folded]


def _mistyped(sent: _Spelling, accepted: Sequence[_Spelling]) -> Ranked:
    if len(sent.folded) < 4:  # one letter off a name of three letters or fewer can be any other name
        return []
    return [(1, other.name) for other in accepted
            if len(other.folded) >= 4 and _one_edit_apart(sent.folded, other.folded)]


def _contained(sent: _Spelling, accepted: Sequence[_Spelling]) -> Ranked:
    """The names that are a run of whole words of `sent` (`path` in `file_path`), or of which `sent`
    is (`limit` for `lim`, abbreviated), scored by how much of the longer the shorter covers: in
    words, then, where `sent` is the longer, in letters (`video` before `id` in `video_id`). A name
    inside a word ("time" in `fromTimezone`, "id" in `video_width`) is not contained."""
    ranked: Ranked = []
    for other in accepted:
        if sent.folded not in other.folded and other.folded not in sent.folded:
            continue  # a run of words holds the letters of the other in a row: most names stop here
        if len(sent.words) <= len(other.words):
            hit = _run_of_words(sent.words, other.words, abbreviated=len(sent.folded) >= 3)
            letters = 0.0  # several longer names holding `sent` alike: none is likelier
        else:
            hit = _run_of_words(other.words, sent.words, abbreviated=False)
            letters = len(other.folded) / len(sent.folded)
        if hit:
            words = sorted((len(sent.words), len(other.words)))
            ranked.append(((words[0] / words[1], letters), other.name))
    return ranked


def _sharing_words(sent: _Spelling, accepted: Sequence[_Spelling]) -> Ranked:
    """The names that share a whole word of two letters or more with `sent` (`person_id` and
    `user_id`), scored by the share of their words together."""
    ranked: Ranked = []
    for other in accepted:
        shared = set(sent.words).intersection(other.words)
        if any(len(word) > 1 for word in shared):
            ranked.append((len(shared) / len(set(sent.words).union(other.words)), other.name))
    return ranked


def _similar(sent: _Spelling, accepted: Sequence[_Spelling], threshold: float) -> Ranked:
    # Only names of about the same length are scored: Jaro weighs all of the shorter name's
    # letters, so "id" scores over the threshold against any long name starting "i", "d".
    near = [other for other in accepted
            if 2 * min(len(sent.folded), len(other.folded)) >= max(len(sent.folded), len(other.folded))]
    scored = [(jaro(sent.folded, other.folded), other.name) for other in near]
    return [(score, name) for score, name in scored if score > threshold]


def _likeliest(ranked: Ranked, preferred: Collection[str]) -> str | None:
    """The best-scored name; of several alike, the one preferred, else none: a guess between
    `min_age` and `max_age` for `age` is as likely wrong as right, and the model knows which."""
    top = max(score for score, _ in ranked)
    tied = [name for score, name in ranked if score == top]
    if len(tied) > 1:
        tied = [name for name in tied if name in preferred]
    return tied[0] if len(tied) == 1 else None


def _suggest(sent: _Spelling, accepted: Sequence[_Spelling], threshold: float,
             preferred: Collection[str]) -> str | None:
    for kind in (_respelled, _mistyped, _contained, _sharing_words):
        if ranked := kind(sent, accepted):
            return _likeliest(ranked, preferred)
    similar = _similar(sent, accepted, threshold)
    return _likeliest(similar, preferred) if similar else None


def suggest(sent: str, accepted: Sequence[str], threshold: float = SIMILARITY_THRESHOLD,
            preferred: Collection[str] = ()) -> str | None:
    """The accepted name the model most likely meant by `sent`, or None. Tried in turn, the first
    kind that finds any deciding: the same name in another case or spelling (`pageSize` for
    `page_size`), one typo away, containing or contained in whole words (`file_path` for `path`,
    `lim` for `limit`), sharing a word (`person_id` for `user_id`), then a Jaro similarity above
    `threshold`. Of names alike, the one in `preferred` (check_names: the missing ones)."""
    return _suggest(_Spelling.of(sent), [_Spelling.of(name) for name in accepted], threshold, preferred)


def fitting_names(sent: str, accepted: Sequence[str], threshold: float) -> list[str]:
    """The names of `accepted` that `sent` could stand for, by the first of these that finds any: the
    same name in another case or spelling, one typo away, a run of whole words of the other (either
    way), a Jaro similarity above `threshold`. (Not a shared word alone: `person_id` for `user_id` is
    a guess.) Argument repair renames only when exactly one fits (gateway.tools.repair): `FIELD_1` is
    `field_1` respelled, though one letter from `field_0` too; `date` is a word of `start_date` and of
    `end_date` alike."""
    spelled, others = _Spelling.of(sent), [_Spelling.of(name) for name in accepted]
    for kind in (_respelled, _mistyped, _contained):
        if found := {name for _, name in kind(spelled, others)}:
            return [name for name in accepted if name in found]
    similar = {name for _, name in _similar(spelled, others, threshold)}
    return [name for name in accepted if name in similar]


@dataclass(frozen=True)
class NameCheck:
    """What a set of sent argument names lacks or adds relative to a declaration."""

    required: tuple[str, ...]
    accepted: tuple[str, ...]
    missing: tuple[str, ...]
    unrecognized: tuple[str, ...]
    suggestions: tuple[tuple[str, str], ...]  # (sent, meant)
    unrecognized_unshown: int = 0  # past MAX_NAMES_SHOWN


MAX_NAMES_SHOWN = 20  # a model can send thousands of keys; the diagnostic names the first few
MAX_NAME_CHARS = 64


def check_names(sent: Iterable[str], required: Sequence[str], accepted: Sequence[str]) -> NameCheck:
    sent = list(sent)
    sent_set = set(sent)
    missing = tuple(name for name in required if name not in sent_set)
    strangers = [name for name in sent if accepted and name not in accepted]
    unrecognized = tuple(name[:MAX_NAME_CHARS] for name in strangers[:MAX_NAMES_SHOWN])
    suggestions = _suggestions(unrecognized, [name for name in accepted if name not in sent_set], missing)
    return NameCheck(tuple(required), tuple(accepted), missing, unrecognized, suggestions,
                     len(strangers) - len(unrecognized))


def _suggestions(unrecognized: Sequence[str], unsent: Sequence[str],
                 missing: Collection[str]) -> tuple[tuple[str, str], ...]:
    """(sent, meant) for each unrecognized name with a likely meaning: a parameter not sent, a
    missing one before others alike."""
    if not unrecognized:
        return ()
    spelled = [_Spelling.of(name) for name in unsent]
    found = ((name, _suggest(_Spelling.of(name), spelled, SIMILARITY_THRESHOLD, missing)) for name in unrecognized)
    return tuple((name, hint) for name, hint in found if hint is not None)


def _listing(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "(none)"


def name_lines(check: NameCheck, *, show_missing: bool = True) -> list[str]:
    """Required, missing, unrecognized (with hints) and accepted names, a line each."""
    hints = dict(check.suggestions)
    lines = [f"Required parameters: {_listing(check.required)}"]
    if show_missing and check.missing:
        lines.append(f"Missing: {_listing(check.missing)}")
    if check.unrecognized and check.accepted:
        shown = [f"{n} (did you mean '{hints[n]}'?)" if n in hints else n for n in check.unrecognized]
        more = f" and {check.unrecognized_unshown} more" if check.unrecognized_unshown else ""
        lines.append(f"Unrecognized: {', '.join(shown)}{more}")
    if check.accepted:
        lines.append(f"Accepted parameters: {_listing(check.accepted)}")
    return lines


def describe_names(tool: str, check: NameCheck, headline: str) -> str:
    """The model-facing diagnostic for a call whose argument names do not fit the tool."""
    return "\n".join([
        f"Tool '{tool}': {headline}",
        *name_lines(check),
        f"Call '{tool}' again, passing every required parameter under its accepted name.",
    ])


_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


def without_titles(schema: Any) -> Any:
    """A copy of a generated JSON schema minus pydantic's "title" keys, which cost the model
    tokens and say nothing the property names do not. Property *names* called "title" stay."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: without_titles(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [without_titles(sub) for sub in value]
        elif key in ("items", "additionalProperties", "not"):
            out[key] = without_titles(value)
        else:
            out[key] = value
    return out
