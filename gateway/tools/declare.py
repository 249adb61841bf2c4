"""`@tool`: a Tool from a typed signature and its docstring."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, get_type_hints, overload

from pydantic import Field, create_model

from gateway.tools.function import Tool
from gateway.tools.params import ToolDeclarationError
from gateway.tools.results import ToolContext

_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$")
_GOOGLE_ITEM = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ITEM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_ANY_SECTION = re.compile(r"^\s*(\w[\w ]*)\s*:\s*$|^\s*:\w+")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(summary, {parameter: description}) from a Google-style or :param:-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        if _GOOGLE_SECTION.match(line):
            in_args, current = True, None
            continue
        if sphinx := _SPHINX_ITEM.match(line):
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        indented = line[:1].isspace() and not line.startswith(" " * 8)
        if in_args and indented and (item := _GOOGLE_ITEM.match(line)):
            current = item.group(1).lstrip("*")
            params[current] = item.group(2).strip()
            continue
        if _ANY_SECTION.match(line):
            in_args, current = False, None
            continue
        if current is not None and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
        elif current is None and not in_args and not params:
            summary.append(line)
    text = " ".join(part.strip() for part in "\n".join(summary).strip().split("\n\n")[0].splitlines())
    return text, params


def _takes_context(hint: Any) -> bool:
    return hint is ToolContext


def _build(fn: Callable[..., Any], name: str | None, description: str | None, options: Mapping[str, Any]) -> Tool:
    tool_name = name or fn.__name__
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDeclarationError(f"tool {tool_name!r}: cannot read its type hints ({exc})") from exc
    summary, docs = parse_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    context_arg: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDeclarationError(f"tool {tool_name!r}: *args and **kwargs cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDeclarationError(f"tool {tool_name!r}: parameter {param.name!r} is positional-only")
        hint = hints.get(param.name, Any)
        if _takes_context(hint):
            context_arg = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, Field(default, description=docs.get(param.name)))
    try:
        model = create_model(f"{tool_name}_arguments", **fields)
    except Exception as exc:
        raise ToolDeclarationError(f"tool {tool_name!r}: its signature has no JSON schema ({exc})") from exc

    def bind(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        return {**args, context_arg: context} if context_arg else args

    async def call_async(args: dict[str, Any], context: ToolContext) -> Any:
        return await fn(**bind(args, context))

    def call_sync(args: dict[str, Any], context: ToolContext) -> Any:
        return fn(**bind(args, context))

    body = call_async if inspect.iscoroutinefunction(fn) else call_sync
    return Tool(name=tool_name, description=description if description is not None else summary,
                args_model=model, function=body, **options)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(*, name: str | None = None, description: str | None = None, concurrent: bool = False,
         timeout: float | None = None, display_text: str | None = None, strict: bool = False,
         options: Mapping[str, Any] | None = None, approval: bool = False,
         approval_timeout: float | None = None,
         guardrails: Sequence[Any] = ()) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         concurrent: bool = False, timeout: float | None = None, display_text: str | None = None,
         strict: bool = False, options: Mapping[str, Any] | None = None, approval: bool = False,
         approval_timeout: float | None = None, guardrails: Sequence[Any] = ()) -> Any:
    """Declare a tool from a typed function. Arguments are validated against the signature
    (pydantic), so a wrong type or a renamed argument comes back to the model in one message.
    A parameter annotated `ToolContext` receives the call's context and is hidden from the model."""
    extra = {"concurrent": concurrent, "timeout": timeout, "display_text": display_text,
             "strict": strict, "options": dict(options or {}), "approval": approval,
             "approval_timeout": approval_timeout, "guardrails": tuple(guardrails)}
    if fn is not None:
        return _build(fn, name, description, extra)
    return lambda f: _build(f, name, description, extra)
