"""How deep arrays and objects nest in a decoded JSON value."""

from __future__ import annotations

from typing import Any


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels in `value`, as orjson decoded it
    (exactly dict and list). The gateway re-encodes what the provider sends (to the caller, to the
    provider again as history, into its records), and orjson refuses to encode past 255 levels: a
    deeper answer found only then was a 500. Walked level by level without recursion, so any depth
    is safe to check; one list per level rather than a (child, depth) pair per container, and
    arrays and objects told by `type(...) is` rather than isinstance against a tuple: each walks
    a large conversation markedly faster (docs/benchmarks.md)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
        level = below
    return False


def decoded_nests_deeper(raw: bytes, value: Any, limit: int) -> bool:
    """`nests_deeper(value, limit)` of a `value` orjson decoded from `raw`, without the walk when the
    text settles it: each level of nesting opens with a `[` or `{` of the text, so a text with no
    more than `limit` of them (those in strings counted too) nests no deeper. Counted in C, the
    brackets of a usual request or answer cost a fraction of the walk's instructions; a text with
    more is walked."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return nests_deeper(value, limit)
