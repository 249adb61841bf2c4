"""HTML built the autoescaping way: every value put into a template is escaped, unless it is
already `Html` (markup this module or a template made). Model-chosen tool names, argument names
and arguments reach the page, and they are hostile input: a value can only become markup by going
through `escape`, `render` or `join`."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Final


class Html(str):
    """A string that is markup already: templates insert it as it is."""

    __slots__ = ()


EMPTY: Final = Html("")


def escape(value: object) -> Html:
    """`value` as text in HTML (element content or a quoted attribute value)."""
    return value if isinstance(value, Html) else Html(html.escape(str(value), quote=True))


def render(template: str, /, **values: object) -> Html:
    """`template` (str.format syntax, markup written in this code base) with each value escaped."""
    return Html(template.format(**{name: escape(value) for name, value in values.items()}))


def join(parts: Iterable[Html], separator: str = "") -> Html:
    return Html(escape(separator).join(escape(part) for part in parts))


def when(condition: object, markup: Html) -> Html:
    return markup if condition else EMPTY
