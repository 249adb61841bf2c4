"""Text a caller or a provider chose, made safe where a person reads it: a log line, a terminal.

A path, a model name, a tool's arguments or a provider's error message may hold control
characters. Written as they are, a CR or LF starts a forged log line, and an ESC sequence sets a
terminal's title, clears its screen or rewrites what it shows. Here every such character becomes
a visible escape: `\\n`, `\\r` and `\\t`, the others as `\\u` and four hex digits (which is also
an escape JSON reads back, so JSON output stays valid JSON). What counts: the C0 controls, DEL,
the C1 controls (a lone 0x9b is a CSI on many terminals), the line and paragraph separators, and
the bidirectional controls that make text read other than it is stored.
"""

from __future__ import annotations

import re

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                                  "\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT.get(char) or f"\\u{ord(char):04x}"


def visible(text: str) -> str:
    """`text` on one line, every control character in it shown as an escape."""
    return _CONTROL.sub(_escape, text)


def visible_lines(text: str) -> str:
    """`text` with its line breaks kept and every other control character shown as an escape: for
    output whose lines the program itself composed (a timeline, a traceback)."""
    return _CONTROL_BUT_NEWLINE.sub(_escape, text)
