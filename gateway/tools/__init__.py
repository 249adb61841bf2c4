"""The tool API: declare tools, register them, parse and execute the calls a model makes."""

from gateway.tools.aliases import Alias
from gateway.tools.arguments import read_arguments
from gateway.tools.declare import parse_docstring, tool
from gateway.tools.executor import ToolExecutor
from gateway.tools.function import Tool, accepted_param_names, required_param_names
from gateway.tools.hooks import NoHooks, Step, ToolCall, ToolCallTrace, ToolHooks, Turn
from gateway.tools.params import NameCheck, Param, ToolDeclarationError, suggest
from gateway.tools.registry import ToolRegistry
from gateway.tools.results import (
    Content,
    Interrupt,
    Parsed,
    Rejection,
    RejectionReason,
    Status,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolResult,
)
from gateway.tools.threads import ToolsBusy, ToolThreads

__all__ = [
    "Alias", "Content", "Interrupt", "NameCheck", "NoHooks", "Param", "Parsed", "Rejection", "RejectionReason",
    "Status", "Step", "Tool", "ToolCall", "ToolCallTrace", "ToolContext", "ToolDeclarationError",
    "ToolError", "ToolExecutor", "ToolHooks", "ToolOutcome", "ToolRegistry", "ToolResult", "ToolThreads",
    "ToolsBusy", "Turn",
    "accepted_param_names", "read_arguments", "parse_docstring", "required_param_names", "suggest",
    "tool",
]
