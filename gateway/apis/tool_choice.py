"""The tool_choice for the round after the gateway ran tools, in OpenAI's shapes (Chat's nested
and the Responses API's flat ones): forcing a call again would loop for ever."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def _forced_name(choice: Any) -> str | None:
    """The tool a tool_choice forces: Chat `{"type": "function", "function": {"name"}}`,
    Responses `{"type": "function", "name"}`."""
    if not isinstance(choice, Mapping):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    return name if isinstance(name, str) else None


def relaxed_tool_choice(choice: Any, ran: Collection[str]) -> Any:
    """The tool_choice for the round after the gateway ran `ran`: "required", or a forced tool that
    ran, becomes "auto", and an allowed-tools choice in required mode keeps its tools in auto mode
    (Responses' flat shape, Chat's nested one)."""
    if choice == "required" or (_forced_name(choice) in ran):
        return "auto"
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        inner = choice.get("allowed_tools")
        if isinstance(inner, Mapping) and inner.get("mode") == "required":
            return {**choice, "allowed_tools": {**inner, "mode": "auto"}}
        if choice.get("mode") == "required":
            return {**choice, "mode": "auto"}
    return choice
