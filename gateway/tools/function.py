"""Tool: a declared tool, its parse step (the arguments read by gateway.tools.arguments, then
checked against what it declares) and its execute step (the body run, its result normalised).
The arguments schema it declares is built by gateway.tools.declared_schema."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from jsonschema.protocols import Validator
from pydantic import BaseModel, ValidationError

from gateway.tools.aliases import alias_table, clashing, declared_aliases, unaliased
from gateway.tools.arguments import read_arguments
from gateway.tools.declared_schema import declared_schema
from gateway.tools.params import (
    NameCheck,
    Param,
    ToolDeclarationError,
    check_names,
    describe_names,
    name_lines,
    schema_names,
)
from gateway.tools.results import (
    Interrupt,
    Parsed,
    Rejection,
    RejectionReason,
    ToolContext,
    ToolError,
    ToolOrigin,
    ToolOutcome,
    exception_text,
    failure,
    format_traceback,
    normalise,
    rejected,
    rescued_message,
)
from gateway.tools.schema import bounded_validator, closed_to_other_names, describe_problems, value_problems
from gateway.tools.schema_bounds import INLINE, OverBudget, Skipped, metered
from gateway.tools.strict import strict_schema
from gateway.tools.strict_nulls import drop_optional_nulls, required_nulls
from gateway.tools.threads import ToolsBusy, ToolThreads

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")
_MISSING_ARGUMENT = re.compile(r"missing \d+ required (?:positional|keyword-only) arguments?: (.+)$")
_QUOTED = re.compile(r"'([^']+)'")


def _positional_arity(fn: Callable[..., Any], what: str, tool: str) -> int:
    """1 or 2: whether `fn` takes (args) or (args, context)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2  # builtins without a signature: assume the documented two-argument form
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not positional or len(required) > 2:
        raise ToolDeclarationError(f"tool {tool!r}: {what} must take (args) or (args, context)")
    return 1 if len(positional) == 1 else 2


def _describe_violations(tool: str, exc: ValidationError, check: NameCheck) -> str:
    errors = exc.errors(include_url=False)
    if all(err["type"] == "missing" and len(err["loc"]) == 1 for err in errors):
        return describe_names(tool, check, "required arguments are missing.")  # the plain-check wording
    problems = []
    for err in errors:
        where = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        if err["type"] == "missing":
            problems.append(f"- {where}: missing (required)")
            continue
        sent = json.dumps(err.get("input"), default=str)
        sent = sent if len(sent) <= 60 else sent[:57] + "..."
        problems.append(f"- {where}: {err['msg']} (got {sent})")
    count = len(problems)
    noun = "1 argument does" if count == 1 else f"{count} arguments do"
    headline = f"Tool '{tool}': {noun} not fit the declared parameters."
    closing = f"Fix every problem listed and call '{tool}' again."
    return "\n".join([headline, *problems, *name_lines(check, show_missing=False), closing])


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A callable the model may use. Declare arguments with at most one of `parameters`,
    `parameters_schema` or `args_model`. With `strict=True` the model is offered strict mode's
    form of the declaration (gateway.tools.strict), and its nulls for optional parameters are
    read as "not sent". With `validate_schema=True` the parse step also checks the values against
    the declared schema, and refuses names it does not list (gateway.tools.schema); a schema that
    refers outside itself, or a check past its budget, leaves the values to the tool (and says so:
    Parsed.unchecked). With
    `approval=True` a reviewer approves each call before its body runs (gateway.tools.approvals),
    waiting at most `approval_timeout` seconds (unset: the gateway's approval_timeout_seconds)."""

    name: str
    function: Callable[..., Any]
    description: str = ""
    parameters: Sequence[Param] | None = None
    parameters_schema: Mapping[str, Any] | None = None
    args_model: type[BaseModel] | None = None
    parse_args: Callable[..., Any] | None = None
    concurrent: bool = False
    timeout: float | None = None
    display_text: str | None = None
    strict: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    validate_schema: bool = False
    approval: bool = False
    approval_timeout: float | None = None
    origin: ToolOrigin | None = None
    # names of built-in guardrails, module:attr paths, or guardrail objects (gateway.guardrails)
    guardrails: tuple[Any, ...] = ()
    # other names a parameter is accepted under, by parameter (gateway.tools.aliases), beside those its
    # Params or Annotated hints declare
    aliases: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # what the gateway does with arguments it can repair (gateway.tools.repair): None leaves it to the
    # settings (argument_repair, tool_argument_repair) and the caller's key
    argument_repair: Literal["off", "observe", "apply"] | None = None
    schema: dict[str, Any] = field(init=False, repr=False, compare=False)  # what the model is offered
    declared_schema: dict[str, Any] = field(init=False, repr=False, compare=False)  # what the tool declared
    required_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    accepted_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _call_arity: int = field(init=False, repr=False, compare=False)
    _parser_arity: int = field(init=False, repr=False, compare=False)
    _validator: Any = field(init=False, repr=False, compare=False)
    alias_of: dict[str, str] = field(init=False, repr=False, compare=False)  # alias -> parameter

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ToolDeclarationError(
                f"tool name {self.name!r} is invalid: use 1 to 64 letters, digits, '_' or '-'")
        if not callable(self.function):
            raise ToolDeclarationError(f"tool {self.name!r}: function is not callable")
        if self.timeout is not None and not self.timeout > 0:
            raise ToolDeclarationError(f"tool {self.name!r}: timeout must be a positive number")
        if self.approval_timeout is not None and not self.approval_timeout > 0:
            raise ToolDeclarationError(f"tool {self.name!r}: approval_timeout must be a positive number")
        declared = declared_schema(self.name, self.parameters, self.parameters_schema, self.args_model)
        required, accepted = schema_names(declared)  # strict mode's `required` lists optional ones too
        # pydantic checks values in the parse step, unless a parse_args of the tool's own replaces it
        validated = self.args_model is not None and self.parse_args is None
        setattr_ = functools.partial(object.__setattr__, self)
        setattr_("schema", strict_schema(self.name, declared, validated=validated) if self.strict else declared)
        setattr_("declared_schema", declared)
        setattr_("required_names", tuple(required))
        setattr_("accepted_names", tuple(accepted))
        setattr_("options", dict(self.options))
        setattr_("_call_arity", _positional_arity(self.function, "function", self.name))
        parser = self.parse_args
        setattr_("_parser_arity", 0 if parser is None else _positional_arity(parser, "parse_args", self.name))
        setattr_("guardrails", tuple(self.guardrails))
        if not isinstance(self.aliases, Mapping):
            raise ToolDeclarationError(f"tool {self.name!r}: aliases must map parameter names to lists of names")
        aliases = declared_aliases(self.parameters, self.args_model, self.aliases)
        setattr_("aliases", aliases)
        setattr_("alias_of", alias_table(self.name, aliases, accepted))
        if self.argument_repair not in (None, "off", "observe", "apply"):
            raise ToolDeclarationError(f"tool {self.name!r}: argument_repair is off, observe or apply, not "
                                       f"{self.argument_repair!r}")
        if self.parameters is not None:
            setattr_("parameters", tuple(self.parameters))
        if self.validate_schema and (self.parse_args is not None or self.args_model is not None):
            raise ToolDeclarationError(f"tool {self.name!r}: validate_schema is for a declared schema; "
                                       "parse_args and args_model check arguments themselves")
        setattr_("_validator", bounded_validator(self.name, declared) if self.validate_schema else None)

    @functools.cached_property
    def declared_validator(self) -> Validator | Skipped:
        """The validator of the declared schema, or why values are not checked against it (Skipped):
        the parse step's own when the tool checks values, else built the first time it is wanted
        (argument repair checks its fixes with it), with the budget a tool's build has. Built once,
        it does not depend on how busy the machine is when a call needs it; a schema that is no
        valid JSON Schema (a tool that never checks values may declare one) is "invalid_schema"."""
        if self._validator is not None:
            return self._validator
        try:
            return bounded_validator(self.name, self.declared_schema)
        except ToolDeclarationError:
            return "invalid_schema"

    async def declared_validator_built(self) -> Validator | Skipped:
        """declared_validator, built on a thread the first time it is wanted: compiling a declared
        schema may take up to a tool build's budget, which the event loop must not wait for."""
        if self._validator is not None or "declared_validator" in self.__dict__:
            return self.declared_validator
        return await asyncio.to_thread(lambda: self.declared_validator)

    # --- parse --------------------------------------------------------------------------------

    async def parse_arguments(self, args: str | Mapping[str, Any] | None, context: ToolContext) -> Parsed | Rejection:
        """The parse step: exactly the argument handling a call runs before the body (the tool's
        own `parse_args`, if it has one), without the body."""
        decoded = read_arguments(self.name, args)
        if isinstance(decoded, Rejection):
            return decoded
        if clashes := clashing(decoded, self.alias_of):
            return self._clash_rejection(decoded, clashes)
        decoded, aliases = unaliased(decoded, self.alias_of)
        parsed = await self._parsed(decoded, context)
        return replace(parsed, aliases=aliases) if aliases else parsed

    def _clash_rejection(self, args: dict[str, Any], clashes: dict[str, list[str]]) -> Rejection:
        """A parameter sent under two of its names (itself and an alias, or two aliases)."""
        said = "; ".join(f"{' and '.join(repr(name) for name in sent)} both name parameter {parameter!r}"
                         for parameter, sent in clashes.items())
        check = check_names(args, self.required_names, self.accepted_names)
        return Rejection("schema_violation", "\n".join([
            f"Tool '{self.name}': {said}.", *name_lines(check, show_missing=False),
            f"Call '{self.name}' again, sending each parameter once, under its accepted name."]), check)

    async def _parsed(self, decoded: dict[str, Any], context: ToolContext) -> Parsed | Rejection:
        if self.strict:
            decoded = drop_optional_nulls(decoded, self.declared_schema)
        if self.parse_args is not None:
            return await self._run_parser(decoded, context)
        check = check_names(decoded, self.required_names, self.accepted_names)
        if self.args_model is not None:
            return self._validate_model(decoded, check)
        if self._validator is not None:
            return self._validate_values(decoded, check)
        if self.strict and (nulls := required_nulls(decoded, self.declared_schema)):
            return self._null_rejection(decoded, nulls)
        if check.missing:
            return Rejection("missing_arguments",
                             describe_names(self.name, check, "required arguments are missing."), check)
        return Parsed(decoded)

    def _null_rejection(self, args: dict[str, Any], nulls: list[str]) -> Rejection:
        """A strict model's null means "not sent", so a required parameter that does not take null
        is missing when it comes as null."""
        check = check_names([name for name in args if name not in nulls], self.required_names, self.accepted_names)
        return Rejection("missing_arguments",
                         describe_names(self.name, check, "required arguments are missing or null."), check)

    async def _run_parser(self, args: dict[str, Any], context: ToolContext) -> Parsed | Rejection:
        assert self.parse_args is not None
        try:
            result = self.parse_args(args) if self._parser_arity == 1 else self.parse_args(args, context)
            if inspect.isawaitable(result):
                result = await result
        except ToolError as exc:
            return Rejection("parser", exc.message)
        except (Exception, SystemExit) as exc:  # SystemExit: an argparse-based parser rejecting
            return Rejection("parser", rescued_message(exc), exception=exc, traceback=format_traceback(exc))
        if result is None:
            return Parsed(args)
        if isinstance(result, Mapping):
            return Parsed(dict(result))
        error = TypeError(f"parse_args of tool {self.name!r} returned {type(result).__name__}; "
                          "it must return None or a dict, or raise ToolError")
        return Rejection("parser", rescued_message(error), exception=error, traceback=format_traceback(error))

    def _validate_values(self, args: dict[str, Any], check: NameCheck) -> Parsed | Rejection:
        """The values checked on the event loop within the INLINE budget; past it, or for a schema
        that cannot be checked at a bounded cost (schema_bounds), the names alone, and the server
        (an MCP tool's) checks the rest."""
        skipped = cast(Skipped, self._validator) if isinstance(self._validator, str) else None
        problems: list[str] = []
        if skipped is None:
            with metered(INLINE):
                try:
                    problems = value_problems(self._validator, args, check)
                except OverBudget:
                    skipped = "too_complex"
        refuse_unrecognized = bool(check.unrecognized) and closed_to_other_names(self.declared_schema)
        if not (problems or check.missing or refuse_unrecognized):
            return Parsed(args, unchecked=skipped)
        reason: RejectionReason = "missing_arguments" if check.missing else "schema_violation"
        return Rejection(reason, describe_problems(self.name, check, problems, refuse_unrecognized), check)

    def _validate_model(self, args: dict[str, Any], check: NameCheck) -> Parsed | Rejection:
        assert self.args_model is not None
        try:
            model = self.args_model.model_validate(args)
        except ValidationError as exc:
            reason: RejectionReason = "missing_arguments" if check.missing else "parser"
            return Rejection(reason, _describe_violations(self.name, exc, check), check, exception=exc)
        return Parsed({name: getattr(model, name) for name in type(model).model_fields})

    # --- execute ------------------------------------------------------------------------------

    async def execute(self, parsed: Parsed, context: ToolContext, default_timeout: float | None = None,
                      threads: ToolThreads | None = None) -> ToolOutcome:
        """The execute step: the body on parsed arguments; never raises for anything the body does.
        A sync body runs on `threads` (the executor's pool), else on the loop's default executor."""
        limit = self.timeout if self.timeout is not None else default_timeout
        args = parsed.arguments
        template = ToolOutcome(call_id=context.tool_call_id, tool_name=self.name, status="ok", content="",
                               arguments=args, display_text=self.display_text)
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                value = await self._call(args, context, threads)
        except ToolsBusy as exc:
            message = (f"Tool '{self.name}' is busy and did not run: all {exc.size} threads for tools are held by "
                       "earlier calls that did not finish. Try again later.")
            return replace(template, status="error", content=message, error_type="tool_busy")
        except TimeoutError as exc:
            if not deadline.expired():
                return self._failure(exc, template)
            message = (f"Tool '{self.name}' did not finish within {limit:g} s and was abandoned. "
                       "Its effects are unknown; check before calling it again.")
            return replace(template, status="timeout", content=message, error_type="timeout")
        except Interrupt as exc:
            return replace(template, status="interrupted", content=exc.message, interrupt_data=exc.data)
        except ToolError as exc:
            return replace(template, status="error", content=exc.message, error_type="ToolError")
        except (Exception, SystemExit) as exc:
            return self._failure(exc, template)
        try:
            return normalise(value, template)
        except Exception as exc:  # a malformed result (say, ToolResult(options=None)) is the tool's fault
            return failure(template, exc)

    async def _call(self, args: dict[str, Any], context: ToolContext, threads: ToolThreads | None) -> Any:
        call = functools.partial(self.function, args)
        if self._call_arity == 2:
            call = functools.partial(call, context)
        if inspect.iscoroutinefunction(self.function):
            return await call()
        # Blocking bodies run off the event loop.
        result = await (threads.run(call) if threads is not None else asyncio.to_thread(call))
        return await result if inspect.isawaitable(result) else result

    def _failure(self, exc: BaseException, template: ToolOutcome) -> ToolOutcome:
        args = template.arguments or {}
        diagnosis = None if self.parse_args or self.args_model else self._argument_problem(exc, args)
        if diagnosis is None:
            return failure(template, exc)
        message, check = diagnosis
        return replace(failure(template, exc, message), names=check)

    def _argument_problem(self, exc: BaseException, args: dict[str, Any]) -> tuple[str, NameCheck] | None:
        """When the body failed on an argument name, the diagnostic a model can act on."""
        accepted = self.accepted_names
        if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
            key = exc.args[0]
            if key in args or (accepted and key not in accepted):
                return None  # not a lookup of a missing argument
            required = tuple(dict.fromkeys([*self.required_names, key]))
            check = check_names(args, required, accepted)
            return describe_names(self.name, check, f"the tool needs argument '{key}', which was not sent."), check
        if isinstance(exc, TypeError):
            text = exception_text(exc)
            if match := _UNEXPECTED_KEYWORD.search(text):
                check = check_names(args, self.required_names, accepted)
                headline = f"the tool does not take an argument named '{match.group(1)}'."
                return describe_names(self.name, check, headline), check
            if match := _MISSING_ARGUMENT.search(text):
                wanted = _QUOTED.findall(match.group(1))
                check = check_names(args, tuple(dict.fromkeys([*self.required_names, *wanted])), accepted)
                return describe_names(self.name, check, "required arguments are missing."), check
        return None

    async def call(self, args: str | Mapping[str, Any] | None, context: ToolContext,
                   default_timeout: float | None = None, threads: ToolThreads | None = None) -> ToolOutcome:
        """Parse, then execute: the whole call, without the executor's telemetry."""
        parsed = await self.parse_arguments(args, context)
        if isinstance(parsed, Rejection):
            return rejected(context.tool_call_id, self.name, parsed)
        return await self.execute(parsed, context, default_timeout, threads)


def required_param_names(tool: Tool) -> list[str]:
    return list(tool.required_names)


def accepted_param_names(tool: Tool) -> list[str]:
    """[] means the declaration does not enumerate its parameters: unknown, not "none"."""
    return list(tool.accepted_names)
