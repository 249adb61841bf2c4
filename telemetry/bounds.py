"""Text that callers, models and providers choose, made safe for spans: valid UTF-8, bounded."""

from __future__ import annotations

ATTRIBUTE_MAX = 200  # characters of one caller- or provider-chosen string on a span


def utf8(text: str) -> str:
    """`text` with lone surrogates (valid in JSON escapes, not in UTF-8) replaced, so that odd
    input cannot make the span export fail."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def bounded(text: str, limit: int = ATTRIBUTE_MAX) -> str:
    """`text` cut to `limit` characters, as valid UTF-8 (short ASCII text, most of it, as it is)."""
    if len(text) <= limit and text.isascii():
        return text
    return utf8(text[:limit])
