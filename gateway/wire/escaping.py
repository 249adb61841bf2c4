"""Text a caller or a provider chose, made safe where a person reads it: a log line, a terminal.

A path, a model name, a tool's arguments or a provider's error message may hold control
characters. Written as they are, a CR or LF starts a forged log line, and an ESC sequence sets a
terminal's title, clears its screen or rewrites what it shows. Here every such character becomes
a visible escape: `\\n`, `\\r` and `\\t`, the others as `\\u` and four hex digits (which is also
an escape JSON reads back, so JSON output stays valid JSON). What counts: the C0 controls, DEL,
the C1 controls (a lone 0x9b is a CSI on many terminals), the line and paragraph separators, and
the bidirectional controls that make text read other than it is stored.

Credentials written into a URL (`http://user:password@proxy:3128`, `redis://:secret@host`) are
masked in any text said to the operator (`without_credentials`): a refused setting is repeated in
its error, which goes to a terminal, a log and CI output.
"""

from __future__ import annotations

import re

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                                  "\u2066-\u2069]")


# The userinfo of a URL: after a scheme, everything up to the last "@" before a space or a double
# quote (a password may hold an unencoded "/", "@" or "'"; masking too much is the safe side);
# without a scheme, a `name:password@` at the start of a word.
_USERINFO = re.compile(r"""(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^\s"]*@|(?<![^\s'"(=,])[^\s'"/@:]+:[^\s"]*@""")
MASK = "***"


def without_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it masked: `http://***@proxy:3128`."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda match: f"{match.group('scheme') or ''}{MASK}@", text)


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
