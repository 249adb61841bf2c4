"""Tools for `--tools module:attr` loading tests, in every shape an operator might name."""

from __future__ import annotations

from gateway.tools import ToolRegistry, tool


@tool
def shout(text: str) -> str:
    """Upper-case the text.

    Args:
        text: anything
    """
    return text.upper()


@tool
def whisper(text: str) -> str:
    """Lower-case the text.

    Args:
        text: anything
    """
    return text.lower()


@tool
def count_words(text: str) -> int:
    """Count the words in the text.

    Args:
        text: anything
    """
    return len(text.split())


registry = ToolRegistry([shout, whisper])
tool_list = [count_words]
tool_tuple = (count_words, whisper)
by_name = {"shout": shout, "count_words": count_words}
tool_values = by_name.values()  # any iterable of tools will do, not only lists
not_a_tool = 42
mixed = [shout, "whisper"]
a_string = "shout"
