"""Which guardrails apply where: names and import paths resolved into guards once, at start-up,
and each tool's and key's chain made once, on its first call."""

from __future__ import annotations

import fnmatch
import importlib
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.guardrails.builtin import BUILTIN_NAMES, BuiltinOptions, make_builtin
from gateway.guardrails.chain import After, Before, Chains, Guard, guard_of
from gateway.guardrails.verdicts import GuardedCall

if TYPE_CHECKING:
    from gateway.settings.model import Settings

NO_GUARDS: tuple[Guard, ...] = ()
MAX_CHAINS = 10_000  # chains kept, by tool, server and key


class GuardedTool(Protocol):
    """What a chain needs of a tool (gateway.tools.Tool has it): its name, its own guardrails,
    and its origin, whose `server` names an MCP tool's server (None for any other tool)."""

    @property
    def name(self) -> str: ...

    @property
    def guardrails(self) -> tuple[Any, ...]: ...

    @property
    def origin(self) -> Any: ...


def imported(spec: str) -> object:
    """The guardrail a `module:attr` path names: an object with before_execute/after_execute, a
    class of such objects (made with no arguments), or a function that returns one."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"guardrail {spec!r}: expected a built-in ({', '.join(BUILTIN_NAMES)}) or module:attr")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"guardrail {spec!r}: cannot import {module_name!r} ({exc})") from exc
    except Exception as exc:  # the module's own code failed: said in one line, where, not as a traceback
        raise ValueError(f"guardrail {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
                         f"{_where(exc)}") from exc
    try:
        value: Any = getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"guardrail {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if isinstance(value, type) or (callable(value) and not hasattr(value, "before_execute")
                                   and not hasattr(value, "after_execute")):
        try:
            value = value()
        except Exception as exc:
            raise ValueError(f"guardrail {spec!r}: calling {attr} failed ({exc})") from exc
    return value


def _where(exc: BaseException) -> str:
    """Where in the user's code `exc` was raised (the last frame outside the import machinery)."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<frozen") and frame.filename != __file__]
    return f" (at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def named_in(settings: Settings) -> list[str]:
    """Every guardrail the settings name: the gateway's, the tool globs', the keys', the MCP servers'."""
    return [*settings.guardrails, *(name for names in settings.tool_guardrails.values() for name in names),
            *(name for key in settings.keys.values() for name in key.guardrails),
            *(name for server in settings.mcp_servers.values() for name in server.guardrails),
            *(name for server in settings.responses_mcp_servers.values() for name in server.guardrails)]


class Guardrails:
    """The gateway's guardrails: the gateway's list, each tool's, each MCP server's, each key's."""

    def __init__(self, chains: Chains, options: BuiltinOptions | None = None, gateway: Sequence[object] = (),
                 by_key: Mapping[str, Sequence[object]] | None = None,
                 by_tool: Mapping[str, Sequence[object]] | None = None,
                 by_server: Mapping[str, Sequence[object]] | None = None,
                 registry: Iterable[GuardedTool] | None = None) -> None:
        self.chains = chains
        self._options = options if options is not None else BuiltinOptions()
        self._resolved: dict[str, Guard] = {}
        self._gateway = self._guards(gateway)
        self._by_key = {key: self._guards(specs) for key, specs in (by_key or {}).items()}
        self._by_tool = {pattern: self._guards(specs) for pattern, specs in (by_tool or {}).items()}
        self._by_server = {server: self._guards(specs) for server, specs in (by_server or {}).items()}
        self._registry_guards = self._guards(getattr(registry, "guardrails", ()) or ())
        self._tool_chains: dict[tuple[str, str | None, str | None], tuple[Guard, ...]] = {}
        self._client_chains: dict[str | None, tuple[Guard, ...]] = {}
        for tool in registry or ():  # a tool's own list is checked at start-up, not at its first call
            self._guards(tool.guardrails)

    @classmethod
    def from_settings(cls, settings: Settings, registry: Iterable[GuardedTool]) -> Guardrails | None:
        """The gateway's guardrails; None when no list names any (then nothing is spent on a call)."""
        by_key = {name: key.guardrails for name, key in settings.keys.items() if key.guardrails}
        servers = {**settings.mcp_servers, **settings.responses_mcp_servers}  # their names never clash
        by_server = {name: server.guardrails for name, server in servers.items() if server.guardrails}
        declared = any(tool.guardrails for tool in registry) or bool(getattr(registry, "guardrails", ()))
        if not (settings.guardrails or by_key or by_server or settings.tool_guardrails or declared):
            return None
        options = BuiltinOptions(settings.guardrail_max_result_bytes, dict(settings.guardrail_denied_values),
                                 list(settings.guardrail_allowed_url_hosts), settings.guardrail_injection)
        chains = Chains(settings.guardrail_timeout_seconds, settings.guardrail_failure)
        return cls(chains, options, settings.guardrails, by_key, settings.tool_guardrails, by_server, registry)

    def close(self) -> None:
        self.chains.close()

    def _guard(self, spec: object) -> Guard:
        if not isinstance(spec, str):
            return guard_of(spec, getattr(spec, "name", "") or type(spec).__name__)
        found = self._resolved.get(spec)
        if found is None:
            builtin = make_builtin(spec, self._options) if ":" not in spec else None
            if builtin is None and ":" not in spec:
                raise ValueError(f"guardrail {spec!r}: no such built-in (there are {', '.join(BUILTIN_NAMES)}); "
                                 "name your own as module:attr")
            found = self._resolved[spec] = guard_of(builtin if builtin is not None else imported(spec), spec)
        return found

    def _guards(self, specs: Iterable[object]) -> tuple[Guard, ...]:
        return tuple(self._guard(spec) for spec in specs)

    def for_tool(self, tool: GuardedTool, principal: str | None) -> tuple[Guard, ...]:
        """The chain of a call of the gateway's `tool` by the key `principal`."""
        # By name and server, not by the object: an MCP server's tools are new objects at each
        # listing, with the same chain. Bounded: a server that renames its tools for ever starts it over.
        server = tool.origin.server if tool.origin is not None else None
        cache_key = (tool.name, server, principal)
        chain = self._tool_chains.get(cache_key)
        if chain is None:
            if len(self._tool_chains) >= MAX_CHAINS:
                self._tool_chains.clear()
            own = [*self._registry_guards, *self._guards(tool.guardrails)]
            if server is not None:
                own += self._by_server.get(server, ())
            for pattern, guards in self._by_tool.items():
                if fnmatch.fnmatchcase(tool.name, pattern):
                    own += guards
            chain = self._tool_chains[cache_key] = _once([*self._gateway, *own, *self._key(principal)])
        return chain

    def for_client(self, principal: str | None) -> tuple[Guard, ...]:
        """The chain of the client's own tools' calls and results, for the key `principal`."""
        chain = self._client_chains.get(principal)
        if chain is None:
            chain = self._client_chains[principal] = _once([*self._gateway, *self._key(principal)])
        return chain

    def _key(self, principal: str | None) -> tuple[Guard, ...]:
        return self._by_key.get(principal, NO_GUARDS) if principal is not None else NO_GUARDS

    async def before(self, chain: Sequence[Guard], call: GuardedCall) -> Before:
        return await self.chains.before(chain, call)

    async def after(self, chain: Sequence[Guard], call: GuardedCall, result: str) -> After:
        return await self.chains.after(chain, call, result)


def _once(guards: Sequence[Guard]) -> tuple[Guard, ...]:
    """Each guardrail once, where it first comes."""
    seen: set[str] = set()
    kept = []
    for guard in guards:
        if guard.name not in seen:
            seen.add(guard.name)
            kept.append(guard)
    return tuple(kept)
