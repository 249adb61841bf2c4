"""What the built-ins share: the strings in a call's arguments, each with where it sits (what
secrets, denied_values and url_hosts walk), and texts as the built-ins read and quote them.

Arguments nest (objects, arrays, and the pydantic models of a tool declared with one); the walk is
iterative, so depth costs no recursion, and it visits each value once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel

Path = tuple[str | int, ...]  # keys and list indexes, from the top of the arguments
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
SHOWN_NAME = 40  # a caller chooses argument names: a reason quotes at most this much of each


class Found(NamedTuple):
    """One string of the arguments: its `path` and whether it is a key (an argument's name) or a
    value. (A tuple: made for every string of every call, it must cost little.)"""

    path: Path
    text: str
    is_key: bool = False


def _children(value: Any) -> Iterator[tuple[str | int, Any]] | None:
    if isinstance(value, Mapping):
        return iter(value.items())
    if isinstance(value, list | tuple):
        return iter(enumerate(value))
    if isinstance(value, BaseModel):
        return ((name, getattr(value, name, None)) for name in type(value).model_fields)
    return None


def argument_strings(arguments: Mapping[str, Any], keys: bool = False) -> Iterator[Found]:
    """Every string in `arguments`, in order: the values, and the keys too with `keys`."""
    stack: list[tuple[Path, Iterator[tuple[str | int, Any]]]] = [((), iter(arguments.items()))]
    while stack:
        path, children = stack[-1]
        step = next(children, None)
        if step is None:
            stack.pop()
            continue
        name, value = step
        here = (*path, name)
        if keys and isinstance(name, str):
            yield Found(here, name, is_key=True)
        if isinstance(value, str):
            yield Found(here, value)
            continue
        nested = _children(value)
        if nested is not None:
            stack.append((here, nested))


def last_name(path: Path) -> str | None:
    """The name of the argument a value sits under: the nearest key (a list's items are under the
    list's name)."""
    for part in reversed(path):
        if isinstance(part, str):
            return part
    return None


def shown(text: str, limit: int = SHOWN_NAME) -> str:
    """A caller's string as a reason may quote it: control characters escaped, at most `limit`
    characters kept."""
    cut = text[:limit]
    cleaned = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in cut)
    return cleaned + ("..." if len(text) > limit else "")


def shown_path(path: Path, hidden: tuple[str, ...] = ()) -> str:
    """`path` as a reason quotes it (`headers.Authorization`, `urls[2]`), any part that holds one
    of `hidden` replaced."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        name = "[REDACTED]" if any(value in part for value in hidden) else shown(part)
        text += f".{name}" if text else name
    return text or "(the arguments)"


def lowered(text: str) -> str:
    """`text` with A-Z lowered and every character where it was, so that a match in it is a match
    at the same place in `text` (str.lower() keeps the places unless a character lowers to two,
    as U+0130 does; then only A-Z are lowered)."""
    lower = text.lower()
    return lower if len(lower) == len(text) else text.translate(_ASCII_LOWER)
