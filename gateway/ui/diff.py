"""What a corrected retry changed: the failed call's arguments beside the retry's, key by key when
both are JSON objects (the usual case: a renamed, missing or mistyped argument), line by line
(difflib) when either is not."""

from __future__ import annotations

import difflib
import json
from typing import Any

from gateway.ui.markup import Html, join, render

SHOWN_CHARS = 200  # of one value: the whole arguments are in the blocks below


def _object(text: str) -> dict[str, Any] | None:
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def key_changes(failed: dict[str, Any], corrected: dict[str, Any]) -> list[tuple[str, str]]:
    """(sign, line) for each key removed (-), added (+) or given another value (~), in that order."""
    removed = [("-", f"{key}: {_value(value)}") for key, value in failed.items() if key not in corrected]
    added = [("+", f"{key}: {_value(value)}") for key, value in corrected.items() if key not in failed]
    changed = [("~", f"{key}: {_value(value)} → {_value(corrected[key])}") for key, value in failed.items()
               if key in corrected and corrected[key] != value]
    return removed + added + changed


def line_changes(failed: str, corrected: str) -> list[tuple[str, str]]:
    """(sign, line) for each line only one of the texts has."""
    return [(line[0], line[2:]) for line in difflib.ndiff(failed.splitlines(), corrected.splitlines())
            if line[:1] in ("-", "+")]


_KINDS = {"-": "removed", "+": "added", "~": "changed"}


def arguments_diff(failed: str, corrected: str) -> Html:
    """The changes from the failed call's arguments to the retry's, as a list."""
    before, after = _object(failed), _object(corrected)
    changes = key_changes(before, after) if before is not None and after is not None else \
        line_changes(failed, corrected)
    if not changes:
        return render('<div class="diff muted">the same arguments as the failed call</div>')
    items = join(render('<li class="{kind}"><code>{sign} {line}</code></li>', kind=_KINDS[sign], sign=sign, line=line)
                 for sign, line in changes)
    return render('<div class="diff"><div class="label">what the retry changed</div>'
                  '<ul class="changes">{items}</ul></div>', items=items)
