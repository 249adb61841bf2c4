"""The `injection` built-in: markers of prompt injection in a result, flagged (recorded; the model
reads the result) or, with guardrail_injection = "block", blocked.

The markers (case-insensitive; words apart by up to a few spaces or line breaks):
- orders to drop the instructions: "ignore / disregard / forget / override (all) (of) (the / your)
  previous / prior / above / earlier / preceding / system / original / developer instructions /
  prompt(s) / messages / rules / directions / guidelines / context";
- a new identity or mode: "you are now DAN / jailbroken / unrestricted / in developer mode / no
  longer bound ...", "from now on you are / you will / you must", "new instructions:",
  "reveal / print / repeat / show (me) your / the system prompt / hidden instructions";
- fake boundaries of a conversation: chat-template tokens (<|im_start|>, <|im_end|>, <|system|>,
  <|user|>, <|assistant|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>, <|endoftext|>),
  [INST] and [/INST], <<SYS>> and <</SYS>>, <system>, </system>, </tool_result>,
  </function_results>, </tool_output>, "BEGIN SYSTEM PROMPT" / "END SYSTEM PROMPT";
- hidden text: any Unicode tag character (U+E0000 to U+E007F, invisible, readable by a model),
  and a run of three or more zero-width characters (U+200B, U+200C, U+200D, U+2060, U+FEFF;
  one alone is ordinary in emoji and some scripts).
The first marker found is named in the reason, quoted in part; prose that merely talks about
injection ("the phrase 'ignore previous instructions' is an attack") is flagged too: a flag is a
record, which is why it is the default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gateway.guardrails.builtin_text import lowered, shown
from gateway.guardrails.verdicts import GuardedCall, Guardrail, Verdict, block, flag

SHOWN_MARKER = 40  # a reason quotes at most this much of a marker
LOOK_BACK = 48  # how far before "system prompt" / "hidden instructions" the verb is looked for


@dataclass(frozen=True)
class Marker:
    """One marker, found in the lower-cased text by `regex` (which starts with a literal, so that a
    scan is a fast search for it) and, when `before` is set, only where `before` matches the text
    just ahead of it."""

    regex: re.Pattern[str]
    before: re.Pattern[str] | None = None


_GAP = r"[\s\u00a0]{1,8}"  # between two words: a few spaces, tabs or line breaks
_ORDER_REST = (_GAP + r"(?:all" + _GAP + r")?(?:of" + _GAP + r")?(?:(?:the|your|any|my)" + _GAP + r")?"
               r"(?:previous|prior|above|earlier|preceding|system|original|developer)" + _GAP
               + r"(?:instructions?|prompts?|messages?|rules|directions|guidelines|context)")
_REVEAL = re.compile(r"(?:reveal|print|repeat|show)" + _GAP + r"(?:me" + _GAP + r")?(?:your|the)" + _GAP + r"$")
MARKERS: tuple[Marker, ...] = (
    *(Marker(re.compile(verb + _ORDER_REST)) for verb in ("ignore", "disregard", "forget", "override")),
    Marker(re.compile(r"you" + _GAP + r"are" + _GAP + r"now" + _GAP + r"(?:(?:a|an|in)" + _GAP + r")?(?:dan\b|"
                      r"jailbroken|unrestricted|unfiltered|developer" + _GAP + r"mode|no" + _GAP + r"longer"
                      + _GAP + r"bound)")),
    Marker(re.compile(r"from" + _GAP + r"now" + _GAP + r"on,?" + _GAP + r"you" + _GAP + r"(?:are|will|must)\b")),
    Marker(re.compile(r"new" + _GAP + r"instructions\s{0,4}:")),
    Marker(re.compile(r"system" + _GAP + r"prompt"),
           re.compile(_REVEAL.pattern + r"|(?:begin|end)" + _GAP + r"$|(?:begin|end)" + _GAP + r"(?:of" + _GAP
                      + r")?(?:the" + _GAP + r")?$")),
    Marker(re.compile(r"hidden" + _GAP + r"instructions"), _REVEAL),
    Marker(re.compile(r"<(?:\|(?:im_start|im_end|system|user|assistant|start_header_id|end_header_id|eot_id|endoftext)"
                      r"\|>|</?sys>>|/?system>|/(?:tool_result|function_results|tool_output)>)")),
    Marker(re.compile(r"\[/?inst\]")),
)
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_ZERO_WIDTH_RUN = re.compile(f"[{_ZERO_WIDTH}]{{3,}}")
_TAG_RUN = re.compile("[\U000e0000-\U000e007f]+")
# England's, Scotland's and Wales's flags are a black flag, tag letters and a cancel tag: not hidden text
_FLAG = re.compile("\U0001f3f4[\U000e0030-\U000e0039\U000e0061-\U000e007a]{1,6}\U000e007f")
Span = tuple[int, int, str]  # where a marker starts and ends, and what to call it


def _zero_width(text: str) -> Span | None:
    """The first run of three or more zero-width characters: counted first (fast), then looked for
    by the regex from the first of them on (a regex of a class of characters reads every
    character, slowly, so it starts where one is known to be)."""
    if sum(map(text.count, _ZERO_WIDTH)) < 3:
        return None
    first = min(position for position in map(text.find, _ZERO_WIDTH) if position != -1)
    run = _ZERO_WIDTH_RUN.search(text, first)
    if run is None:
        return None
    return run.start(), run.end(), f"invisible text ({run.end() - run.start()} zero-width characters)"


def _tags(text: str) -> Span | None:
    """The first run of Unicode tag characters that is not part of a flag, looked for only when
    the text holds one (their UTF-8 starts F3 A0, which no other character in use does)."""
    if b"\xf3\xa0" not in text.encode("utf-8", "surrogatepass"):
        return None
    for run in _TAG_RUN.finditer(text):
        if _FLAG.match(text, max(0, run.start() - 1)) is None:
            return run.start(), run.end(), f"invisible text ({run.end() - run.start()} Unicode tag characters)"
    return None


def _phrase(text: str) -> Span | None:
    lower = lowered(text)
    first: Span | None = None
    for item in MARKERS:
        for match in item.regex.finditer(lower, 0, first[0] if first is not None else len(lower)):
            start = match.start()
            if item.before is not None:
                ahead = item.before.search(lower, max(0, start - LOOK_BACK), start)
                if ahead is None:
                    continue
                start = ahead.start()
            quoted = " ".join(text[start:match.end()].split())
            first = (start, match.end(), "'" + shown(quoted, SHOWN_MARKER) + "'")
            break
    return first


def marker(text: str) -> str | None:
    """The first marker of prompt injection in `text`, described for a reason; None when there is none."""
    found = [span for span in (_phrase(text), *((_zero_width(text), _tags(text)) if not text.isascii() else ()))
             if span is not None]
    return min(found)[2] if found else None


class Injection(Guardrail):
    """Flags (or blocks) a result that holds a marker of prompt injection."""

    name = "injection"
    inline = True

    def __init__(self, action: Literal["flag", "block"] = "flag") -> None:
        self._action = action

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        found = marker(result)
        if found is None:
            return None
        if self._action == "block":
            return block(f"It holds text that tries to instruct the model ({found}), a sign of prompt injection; "
                         "treat its source as untrusted.")
        return flag(f"a prompt-injection marker: {found}")
