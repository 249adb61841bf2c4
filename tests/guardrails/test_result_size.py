"""The `result_size` built-in: a result over guardrail_max_result_bytes (UTF-8) is cut to fit,
with a note at its end saying how much was cut; a result within it passes untouched."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guardrails import GuardedCall
from gateway.guardrails.builtin import ResultSize

CALL = GuardedCall("read", "call_1", {})
NOTE = re.compile(r"\n\[toolspan: the result was cut here; (\d+) of its (\d+) bytes \(UTF-8\) were left out\]$")


def cut(limit: int, text: str) -> str | None:
    verdict = ResultSize(limit).after_execute(CALL, text)
    if verdict is None:
        return None
    assert verdict.decision == "mask"
    assert verdict.result is not None
    return verdict.result


@pytest.mark.parametrize("text", ["", "short", "x" * 300, "é" * 150])
def test_a_result_within_the_limit_passes(text: str) -> None:
    assert cut(300, text) is None


def test_a_long_result_is_cut_to_the_limit_with_a_note_of_what_was_cut() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    result = cut(1000, text)
    assert result is not None
    assert len(result.encode()) <= 1000
    note = NOTE.search(result)
    assert note is not None, result[-200:]
    head = result[:note.start()]
    assert text.startswith(head)
    assert int(note.group(2)) == len(text.encode())
    assert int(note.group(1)) == len(text.encode()) - len(head.encode())


def test_the_limit_counts_utf8_bytes_and_never_splits_a_character() -> None:
    text = "€" * 400  # three bytes each: 1200 bytes in 400 characters
    result = cut(1000, text)
    assert result is not None
    assert len(result.encode()) <= 1000
    head = result[:NOTE.search(result).start()]  # type: ignore[union-attr]
    assert set(head) == {"€"}


def test_a_limit_smaller_than_the_note_leaves_the_note_alone() -> None:
    result = cut(10, "x" * 100)
    assert result is not None
    assert NOTE.fullmatch(result.lstrip("x")) is not None
    assert result.startswith("\n[toolspan")


@given(text=st.text(min_size=1, max_size=600), limit=st.integers(120, 700))
def test_any_cut_result_fits_and_keeps_a_prefix(text: str, limit: int) -> None:
    result = cut(limit, text)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= limit:
        assert result is None
        return
    assert result is not None
    assert len(result.encode("utf-8", "surrogatepass")) <= limit
    note = NOTE.search(result)
    assert note is not None
    assert text.startswith(result[:note.start()])
