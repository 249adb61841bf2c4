"""Streams for the adapters' tests: an answer's text and its calls' arguments, cut into deltas
anywhere."""

from __future__ import annotations

from hypothesis import strategies as st

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # any character that can travel as UTF-8


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({cut % (len(text) + 1) for cut in cuts})
    return [text[start:end] for start, end in zip([0, *points], [*points, len(text)], strict=True)]


CALLS = st.lists(st.tuples(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), TEXT), max_size=3)
