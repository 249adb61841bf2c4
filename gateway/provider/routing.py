"""Which upstream a request goes to (issue 55): the request's model picks it, by name or alias,
then by pattern, then the default; deployments of one model share the load; fallbacks follow;
upstreams cooling down after failures are passed over. Pure decisions over the table and the
upstreams' state: nothing here talks to a provider."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal, NamedTuple

from gateway.errors import NotFound

Balance = Literal["round_robin", "least_in_flight"]
ApiName = Literal["chat", "responses", "messages"]  # the wire APIs, as gateway.engine.turn.Api
# The wire APIs an upstream of each kind speaks unless its `apis` say otherwise. The OpenAI-compatible
# kinds (vllm, ollama, deepseek, compatible) are not here: a server of theirs may speak Messages as
# well, or not, and says so itself; they are asked for all three.
SERVED_BY_KIND: Mapping[str, tuple[ApiName, ...]] = {
    "openai": ("chat", "responses"), "azure": ("chat", "responses"), "anthropic": ("messages",)}
EVERY_API: tuple[ApiName, ...] = ("chat", "responses", "messages")
_PATTERN_CHARS = frozenset("*?[")


def is_pattern(model: str) -> bool:
    """A `models` entry that is a glob pattern (`gpt-4o*`, `claude-?-*`) rather than a name."""
    return not _PATTERN_CHARS.isdisjoint(model)


def matches(model: str, pattern: str) -> bool:
    """Whether a model name matches a `models` entry (a name, or a glob pattern), case and all."""
    return fnmatchcase(model, pattern) if is_pattern(pattern) else model == pattern


@dataclass(frozen=True)
class UpstreamRoute:
    """What routing reads of one upstream: the models it serves (names and patterns, in order),
    the names clients use for them, where its calls fall back to, the APIs it speaks, and for the
    routing table's lines, what and where it is."""

    kind: str
    url: str
    models: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    fallbacks: tuple[str, ...] = ()
    apis: tuple[str, ...] = ("chat", "responses")


class Target(NamedTuple):
    """One upstream a provider call may go to, with the provider's name for the model; `probe`:
    it is cooling down, and this call is the one that finds out whether it is back; `api`: the
    API it is called in when it does not speak the client's (the call is translated), else None."""

    upstream: str
    model: str
    probe: bool = False
    api: str | None = None


@dataclass(frozen=True)
class Route:
    """Where a model's calls go: `primary` the upstreams that serve it alike (sharing the load), then
    `fallbacks` in order; `matched_by` says how the model was found (name, alias, pattern, default)."""

    primary: tuple[Target, ...]
    fallbacks: tuple[Target, ...]
    matched_by: str


def model_not_found(model: str, offered: Iterable[str]) -> NotFound:
    """What a caller hears of a model no upstream serves: the models it may use instead."""
    names = sorted(set(offered))
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return NotFound(f"the model '{model[:200]}' is not served here; the models you may use: {listed or 'none'}",
                    param="model", code="model_not_found")


@dataclass(frozen=True)
class RoutingTable:
    """The upstreams by name, in the order the configuration gives them, the default one, and
    fallbacks of particular models (by the client's name) that come before their upstreams' own."""

    upstreams: Mapping[str, UpstreamRoute]
    default: str | None
    model_fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def route(self, model: str) -> Route | None:
        """Where `model` goes; None when no upstream serves it and there is no default."""
        named = tuple(Target(name, entry.aliases.get(model, model)) for name, entry in self.upstreams.items()
                      if model in entry.aliases or any(m == model and not is_pattern(m) for m in entry.models))
        if named:
            how = "alias" if any(model in self.upstreams[t.upstream].aliases for t in named) else "name"
            return Route(named, self._fallbacks(named, model), how)
        pattern = self._first_pattern(model)
        if pattern is not None:
            alike = tuple(Target(name, model) for name, entry in self.upstreams.items() if pattern in entry.models)
            return Route(alike, self._fallbacks(alike, model), "pattern")
        if self.default is not None:
            first = (Target(self.default, model),)
            return Route(first, self._fallbacks(first, model), "default")
        return None

    def route_of_default(self) -> Route | None:
        """The default upstream and its fallbacks (None: there is no default)."""
        if self.default is None:
            return None
        first = (Target(self.default, ""),)
        return Route(first, self._fallbacks(first, ""), "default")

    def _first_pattern(self, model: str) -> str | None:
        for entry in self.upstreams.values():
            for candidate in entry.models:
                if is_pattern(candidate) and matches(model, candidate):
                    return candidate
        return None

    def _fallbacks(self, primary: Sequence[Target], model: str) -> tuple[Target, ...]:
        """The fallbacks of the primary upstreams, in order, each once, none of the primary ones.
        A fallback is asked for the model under the name the upstream it stands in for gives it
        (`fast`, east's alias of gpt-4o-mini, is gpt-4o-mini to west too): an upstream with an alias
        of its own for the client's name would serve it as a primary one."""
        seen = {t.upstream for t in primary}
        found = []
        for target in primary:
            for name in (*self.model_fallbacks.get(model, ()), *self.upstreams[target.upstream].fallbacks):
                if name not in seen:
                    seen.add(name)
                    found.append(Target(name, target.model))
        return tuple(found)

    def offered(self) -> list[str]:
        """The model names clients may ask for by name: every upstream's names and aliases."""
        names = [m for entry in self.upstreams.values() for m in (*entry.models, *entry.aliases) if not is_pattern(m)]
        return list(dict.fromkeys(names))

    def describe(self) -> list[str]:
        """The routing table in lines, for `serve` to print at start-up."""
        lines = []
        for name, entry in self.upstreams.items():
            served = ", ".join([*entry.models, *(f"{a} -> {p}" for a, p in entry.aliases.items())]) or "(no models)"
            extra = f"; falls back to {', '.join(entry.fallbacks)}" if entry.fallbacks else ""
            mark = " (default)" if name == self.default else ""
            lines.append(f"  {name}{mark}: {entry.kind} {entry.url}: {served}{extra}")
        return lines


@dataclass
class Balancer:
    """The order in which the primary upstreams of a route share its calls: in turn (round_robin),
    or fewest calls under way first (least_in_flight, ties in turn)."""

    how: Balance = "round_robin"
    in_flight: dict[str, int] = field(default_factory=dict)
    _turns: dict[tuple[str, ...], itertools.count[int]] = field(default_factory=dict)

    def ordered(self, primary: Sequence[Target]) -> list[Target]:
        if len(primary) < 2:
            return list(primary)
        key = tuple(t.upstream for t in primary)
        start = next(self._turns.setdefault(key, itertools.count())) % len(primary)
        turned = [*primary[start:], *primary[:start]]
        if self.how == "least_in_flight":
            turned.sort(key=lambda t: self.in_flight.get(t.upstream, 0))
        return turned

    def started(self, upstream: str) -> None:
        self.in_flight[upstream] = self.in_flight.get(upstream, 0) + 1

    def ended(self, upstream: str) -> None:
        self.in_flight[upstream] = self.in_flight.get(upstream, 1) - 1


def candidates(route: Route, balancer: Balancer, speaks: Callable[[str], str | bool],
               cooling: Mapping[str, float]) -> list[Target]:
    """The targets of one provider call, in the order to try them: the primary ones balanced, then
    the fallbacks. `speaks`: True for an upstream that speaks the request's API, the API to
    translate it to for one that speaks another it can be translated to, False for the others,
    which are left out. `cooling`: the seconds each upstream cooling down has left; one with time
    left goes last (tried only when no other answered), one whose time is up keeps its place; a
    call to either is its probe."""
    ordered = []
    for target in (*balancer.ordered(route.primary), *route.fallbacks):
        spoken = speaks(target.upstream)
        if spoken:
            ordered.append(target if spoken is True else target._replace(api=spoken))
    if not cooling:
        return ordered
    out = [t for t in ordered if cooling.get(t.upstream, 0.0) > 0]
    return [*(t._replace(probe=t.upstream in cooling) for t in ordered if cooling.get(t.upstream, 0.0) <= 0),
            *(t._replace(probe=True) for t in out)]
