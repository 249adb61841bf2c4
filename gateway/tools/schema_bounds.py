"""What keeps checking values against a JSON schema written by someone else (a client's tool
declaration, an MCP server's listing) bounded (issue 53).

- References are resolved inside the schema only: its registry retrieves nothing, and a schema
  with a reference that leads outside it (`$ref` to a URL, `$id` with a relative `$ref`,
  `$dynamicRef`, the metaschemas' own addresses included) is not used (`remote_ref`).
- Before a schema is used it is surveyed: how many subschemas checking one value could apply with
  every reference followed. Each level of references pointing twice at the next doubles that,
  whatever the value; past MAX_EXPANSION the schema is not used (`too_complex`).
- While a schema is checked (against its metaschema, or a value against it), every keyword the
  validator applies spends steps from a budget, each in proportion to what it walks (the items
  of an `enum`, a `uniqueItems` array, ...), and the clock is read every CLOCK_EVERY steps. Past
  the budget the check stops with OverBudget. `uniqueItems` is checked in one pass over the items
  rather than comparing each pair.

The meter is per check, kept in a context variable: the keyword functions are shared by every
validator of a draft, and only the check under way knows its budget. A check run on another thread
sets its own (contexts do not leak between threads)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import referencing.jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema_specifications import REGISTRY as METASCHEMAS
from referencing import Registry, Resource
from referencing.exceptions import InvalidAnchor, NoSuchAnchor, NoSuchResource, PointerToNowhere, Unresolvable

# Why a schema's values are not checked: a reference leading outside it, more work than the budget
# allows (or a feature the bounded check cannot keep bounded), or a reference to nowhere in it.
Skipped = Literal["remote_ref", "too_complex", "invalid_schema"]
Keyword = Callable[[Validator, Any, Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Budget:
    """What one check may spend: `steps` keyword applications (weighted by what each walks), and
    `seconds` of wall time from its start. A check off the event loop `yields` the interpreter's
    lock whenever it reads the clock: an event loop waiting for the lock then takes it at once,
    rather than after the interpreter's switch interval."""

    steps: int
    seconds: float
    yields: bool = False


INLINE = Budget(steps=2_000, seconds=0.01)  # on the event loop: a usual schema compiles in hundreds of steps
OFF_LOOP = Budget(steps=200_000, seconds=1.0, yields=True)  # on a thread of the check's own, past INLINE
MAX_EXPANSION = 20_000  # subschemas one value could meet, references followed
CLOCK_EVERY = 256  # steps between two readings of the clock


class OverBudget(Exception):
    """A check went past its budget."""


class Meter:
    """The budget left to the check under way."""

    __slots__ = ("_until_clock", "_yields", "deadline", "left")

    def __init__(self, budget: Budget, started: float) -> None:
        self.left = budget.steps
        self.deadline = started + budget.seconds
        self._yields = budget.yields
        self._until_clock = CLOCK_EVERY

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise OverBudget
        self._until_clock -= steps
        if self._until_clock <= 0:
            self._until_clock = CLOCK_EVERY
            if time.monotonic() > self.deadline:
                raise OverBudget
            if self._yields:
                time.sleep(0)


_METER: ContextVar[Meter | None] = ContextVar("toolspan_schema_meter", default=None)


class metered:  # named as a function, for it is used as one: `with metered(budget):`
    """Schema work inside spends from `budget` (its time counted from `started`, by
    time.monotonic, or from now); past it, OverBudget. A class rather than a generator: it is
    entered at every checked call."""

    __slots__ = ("_token", "meter")

    def __init__(self, budget: Budget, started: float | None = None) -> None:
        self.meter = Meter(budget, time.monotonic() if started is None else started)

    def __enter__(self) -> Meter:
        self._token = _METER.set(self.meter)
        return self.meter

    def __exit__(self, *exc: object) -> None:
        _METER.reset(self._token)


def spend(steps: int) -> None:
    """`steps` taken from the budget of the check under way (none outside a check)."""
    meter = _METER.get()
    if meter is not None:
        meter.spend(steps)


def metered_keywords(keywords: Mapping[str, Keyword]) -> dict[str, Keyword]:
    """`keywords` (a validator class's VALIDATORS) each spending from the budget before it runs;
    `uniqueItems` in one pass, `anyOf` and `oneOf` each branch up to its first error."""
    wrapped = {name: _metered(keyword) for name, keyword in keywords.items()}
    own: dict[str, Keyword] = {"uniqueItems": unique_items, "anyOf": any_of, "oneOf": one_of}
    wrapped.update({name: keyword for name, keyword in own.items() if name in keywords})
    return wrapped


def _metered(keyword: Keyword) -> Keyword:
    def apply(validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
        meter = _METER.get()
        if meter is not None:  # an enum's items, properties' names ... count too
            meter.spend(1 + len(value) if isinstance(value, (list, dict)) else 1)
        return keyword(validator, value, instance, schema)

    return apply


def unique_items(validator: Validator, unique: Any, instance: Any,
                 schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """jsonschema's `uniqueItems`, with JSON's equality (1 and 1.0 alike, true and 1 not, objects
    whatever their keys' order), by the items' hashable forms: linear in the array where
    comparing pairs is quadratic."""
    spend(1)
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _json_key(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def any_of(validator: Validator, branches: Any, instance: Any,
           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """jsonschema's `anyOf`, with its message, each branch checked only up to its first error:
    jsonschema gathers every error of every branch, which a value failing them all makes the
    costliest way (an array of thousands of items in a branch), and no message here shows them."""
    spend(1 + len(branches))
    if not any(_fits(validator, instance, branch) for branch in branches):
        yield ValidationError(f"{instance!r} is not valid under any of the given schemas")


def one_of(validator: Validator, branches: Any, instance: Any,
           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """jsonschema's `oneOf`, with its messages, each branch checked only up to its first error."""
    spend(1 + len(branches))
    fitting = [branch for branch in branches if _fits(validator, instance, branch)]
    if not fitting:
        yield ValidationError(f"{instance!r} is not valid under any of the given schemas")
    elif len(fitting) > 1:  # named as jsonschema names them: the later ones, then the first
        reprs = ", ".join(repr(branch) for branch in [*fitting[1:], fitting[0]])
        yield ValidationError(f"{instance!r} is valid under each of {reprs}")


def _fits(validator: Validator, instance: Any, branch: Any) -> bool:
    return next(iter(validator.descend(instance, branch)), None) is None


_BOOL, _NUMBER, _ARRAY, _OBJECT, _OTHER = range(5)


def _json_key(value: Any) -> Any:
    """A hashable form of a JSON value, equal for two values exactly when JSON says they are."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool):
        return _BOOL, value
    if isinstance(value, int | float):
        return _NUMBER, value
    if isinstance(value, list):
        spend(1 + len(value))
        return _ARRAY, tuple(_json_key(item) for item in value)
    if isinstance(value, dict):
        spend(1 + len(value))
        return _OBJECT, frozenset((key, _json_key(item)) for key, item in value.items())
    return _OTHER, id(value)  # not JSON: equal to itself only


# --- references ----------------------------------------------------------------------------------

def _refuse(uri: str) -> Resource[Any]:
    raise NoSuchResource(uri)


def local_registry(schema: Any, specification: referencing.Specification[Any]) -> Registry[Any]:
    """A registry holding `schema` and the resources it embeds (each `$id`), crawled once, that
    retrieves nothing."""
    root = specification.create_resource(schema)
    empty: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]
    registry: Registry[Any] = empty.with_resource(root.id() or "", root).crawl()
    return registry


_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
_NESTED_DIALECT = "$schema"  # a subschema naming one: jsonschema then leaves the bounded validator class


class _Skip(Exception):
    def __init__(self, reason: Skipped) -> None:
        super().__init__(reason)
        self.reason = reason


def survey(schema: Any, specification: referencing.Specification[Any], registry: Registry[Any]) -> Skipped | None:
    """Why `schema` (held by `registry`, from local_registry) cannot be checked at a bounded
    cost, or None. Spends a step per subschema."""
    root = specification.create_resource(schema)
    walk = _Walk(specification)
    try:
        walk.size(schema, registry.resolver(root.id() or ""), nested=False)
    except _Skip as skip:
        return skip.reason
    except RecursionError:  # references chained deeper than the interpreter's stack
        return "too_complex"
    except OverBudget:
        raise
    except Exception:  # what referencing cannot read (a schema it was not checked against its metaschema)
        return "invalid_schema"
    if {"unevaluatedProperties", "patternProperties"} <= walk.keywords:
        # jsonschema finds the properties left unevaluated with each patternProperties' regular
        # expression, outside the keyword the bounded validator leaves unchecked
        return "too_complex"
    return None


class _Walk:
    """Subschemas counted as a check could meet them: each reference followed to its target,
    the target counted again for every reference to it (as a check applies it again), each
    distinct subschema walked once. A reference back into one being walked counts nothing more:
    such recursion goes as deep as the value does, and the meter bounds it."""

    _WATCHED = ("unevaluatedProperties", "patternProperties")

    def __init__(self, specification: referencing.Specification[Any]) -> None:
        self._specification = specification
        self._sizes: dict[int, int] = {}
        self._open: set[int] = set()
        self.keywords: set[str] = set()

    def size(self, contents: Any, resolver: Any, nested: bool) -> int:  # resolver: a referencing Resolver
        if not isinstance(contents, dict):
            return 1
        key = id(contents)
        if key in self._sizes:
            return self._sizes[key]
        if key in self._open:
            return 0
        if nested and _NESTED_DIALECT in contents:
            raise _Skip("too_complex")
        spend(1)
        self.keywords.update(keyword for keyword in self._WATCHED if keyword in contents)
        self._open.add(key)
        total = 1
        for keyword in _REFERENCES:
            if isinstance(reference := contents.get(keyword), str):
                target = _resolved(resolver, reference)
                total += self.size(target.contents, target.resolver, nested=True)
        for sub in self._specification.create_resource(contents).subresources():
            total += self.size(sub.contents, resolver.in_subresource(sub), nested=True)
            if total > MAX_EXPANSION:
                raise _Skip("too_complex")
        if total > MAX_EXPANSION:
            raise _Skip("too_complex")
        self._open.discard(key)
        self._sizes[key] = total
        return total


def _resolved(resolver: Any, reference: str) -> Any:  # a Resolver's lookup: its Resolved
    try:
        return resolver.lookup(reference)
    except (PointerToNowhere, NoSuchAnchor, InvalidAnchor) as exc:  # inside the schema, to nowhere
        raise _Skip("invalid_schema") from exc
    except Unresolvable as exc:  # a resource the schema does not hold
        raise _Skip("remote_ref") from exc
    except Exception as exc:  # a reference that is no URI
        raise _Skip("invalid_schema") from exc


# --- the metaschemas, checked with the same bounds ---------------------------------------------------

def metaschema_registry() -> Registry[Any]:
    """jsonschema's metaschemas (every draft and its vocabularies) without their `$schema`, so that
    a validator checking a schema against them stays of the class it was made (jsonschema picks
    the class of each subschema by its `$schema`), crawled once; it retrieves nothing."""
    stripped = [(uri, _without_dialect(METASCHEMAS[uri])) for uri in METASCHEMAS]
    empty: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]
    registry: Registry[Any] = empty.with_resources(stripped).crawl()
    return registry


def _without_dialect(resource: Resource[Any]) -> Resource[Any]:
    contents = resource.contents
    specification = referencing.jsonschema.specification_with(contents.get("$schema", ""))
    return specification.create_resource({key: value for key, value in contents.items() if key != "$schema"})


def first_message(errors: Iterable[ValidationError]) -> str | None:
    """The first error's message (as jsonschema's check_schema reports it), or None."""
    for error in errors:
        return str(error.message)
    return None
