"""Guardrails on the results of the client's own tools (issue 59), as the next request brings them.

A client resends its whole conversation, unmasked, on every request: so every tool result of a
request's body passes the after_execute moment before anything else reads the body (the provider,
the held turns, the answer records, the spans that capture messages), not only the newest. Each
API's adapter says where its results are (ResultPlace); this module reads each one's text, runs the
client chain (Guardrails.for_client) on it and writes back what the setting
`client_result_guardrails` applies:

- observe: every decision is recorded, nothing is changed;
- mask: masks are applied; a block is recorded, not applied (the guardrails after it still run,
  on the text as the ones before left it, so a mask after a block is not lost), but for the block
  of a guardrail that failed under guardrail_failure deny: a text nobody could check is withheld;
- block: the chain as it stands: masks and blocks applied (a blocked result's content is replaced
  by the chain's message, which says why).

A result whose content is not a string or a list of parts, or a list without text parts, is left
as it is (there is nothing for a guardrail to read). A list's text parts are read as one text and,
when masked, give way to one part holding the masked text, where the first of them was.

What the chain decided of a text is kept (ResultVerdicts, a bounded LRU, on this object: per app),
so that a long conversation costs a look-up per result, not a chain run: keyed by the caller's key,
the tool and a digest of the text. A decision in which a guardrail failed is not kept (the next
request tries again).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gateway.guardrails.catalog import Guardrails
from gateway.guardrails.chain import Guard
from gateway.guardrails.verdicts import GuardedCall, GuardrailRecord

ClientResultMode = Literal["off", "observe", "mask", "block"]
UNKNOWN_TOOL = "unknown"  # the tool of a result whose call neither the body nor the state store names
MAX_VERDICTS = 4096  # texts whose decisions are kept
MAX_VERDICT_CHARS = 16 * 1024 * 1024  # characters kept in all (masked texts, messages, hidden values)
MAX_ARGUMENT_CHARS = 64 * 1024  # a call's arguments longer than this reach the guardrails as {}
CONCURRENT_CHECKS = 8  # results of one request checked at once (a cold cache: a resumed conversation)


class ResultPlace(NamedTuple):
    """Where one tool result sits in a request's body: `holder[key]` is its content (a string, or a
    list of parts whose text parts are of type `text_type`). `tool` and `arguments` are those of
    its call, where the body has it (None: it does not)."""

    call_id: str
    holder: dict[str, Any]
    key: str
    text_type: str
    tool: str | None = None
    arguments: object = None


@dataclass(frozen=True)
class Checked:
    """What the guardrails made of one result's text: their records, the values nothing recorded
    may show, and what the provider reads instead: `text` (masked) or `withheld` (blocked), each
    None when nothing is applied."""

    records: tuple[GuardrailRecord, ...]
    hidden: tuple[str, ...] = ()
    text: str | None = None
    withheld: str | None = None

    @property
    def chars(self) -> int:
        return len(self.text or "") + len(self.withheld or "") + sum(map(len, self.hidden)) + 64


@dataclass(frozen=True)
class GuardedResult:
    """One result's decisions, for the report of the client's execute step: the tool its call
    named in the body (None: the body does not say), the records and the hidden values."""

    tool: str | None
    records: tuple[GuardrailRecord, ...]
    hidden: tuple[str, ...]


class ResultVerdicts:
    """Decisions on texts by their key, the most recently used kept, within `size` entries and
    `max_chars` characters. Used from the event loop only."""

    def __init__(self, size: int = MAX_VERDICTS, max_chars: int = MAX_VERDICT_CHARS) -> None:
        self.size = max(1, size)
        self.max_chars = max_chars
        self.hits = 0
        self._chars = 0
        self._entries: OrderedDict[bytes, Checked] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        """Characters kept, as the bound counts them."""
        return self._chars

    def get(self, key: bytes) -> Checked | None:
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, checked: Checked) -> None:
        if checked.chars > self.max_chars:
            return
        old = self._entries.pop(key, None)
        self._chars += checked.chars - (old.chars if old is not None else 0)
        self._entries[key] = checked
        while len(self._entries) > self.size or self._chars > self.max_chars:
            _, gone = self._entries.popitem(last=False)
            self._chars -= gone.chars


def verdict_key(principal: str | None, tool: str, text: str) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{principal or ''}\0{tool}\0".encode("utf-8", "surrogatepass"))
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


def text_of(content: object, text_type: str) -> str | None:
    """The text a guardrail reads of a result's content; None when there is none to read."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [part["text"] for part in content if _is_text(part, text_type)]
    return "\n".join(texts) if texts else None


def _is_text(part: object, text_type: str) -> bool:
    return isinstance(part, dict) and part.get("type") == text_type and isinstance(part.get("text"), str)


def masked(content: str | list[Any], text: str, text_type: str) -> str | list[Any]:
    """`content` with its text replaced by `text`: the text parts of a list give way to one (the
    first, its other fields kept) holding `text`; other parts stay."""
    if isinstance(content, str):
        return text
    parts: list[Any] = []
    placed = False
    for part in content:
        if _is_text(part, text_type):
            if not placed:
                parts.append({**part, "text": text})
                placed = True
            continue
        parts.append(part)
    return parts


def withheld(content: str | list[Any], message: str, text_type: str) -> str | list[Any]:
    """`content` replaced as a whole by `message`, in the same shape (a string, or one text part)."""
    return message if isinstance(content, str) else [{"type": text_type, "text": message}]


def _arguments(raw: object) -> Mapping[str, Any]:
    """A call's arguments as a guardrail sees them: a JSON object decoded (a copy of a Messages
    call's input), anything else {}."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str) or len(raw) > MAX_ARGUMENT_CHARS:
        return {}
    try:
        decoded = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, a number Python will not read, or nested too deep
        return {}
    return decoded if isinstance(decoded, dict) else {}


class ClientResults:
    """The guardrails on the client's results for every request of an app: the chains, the
    setting's mode and the decisions kept."""

    def __init__(self, guardrails: Guardrails, mode: ClientResultMode, verdicts: ResultVerdicts | None = None) -> None:
        self.guardrails = guardrails
        self.mode = mode
        self.verdicts = verdicts if verdicts is not None else ResultVerdicts()

    @classmethod
    def configured(cls, guardrails: Guardrails | None, mode: ClientResultMode) -> ClientResults | None:
        """None when there is nothing to do (no guardrail configured, or the mode off): a request
        then spends nothing on this."""
        return None if guardrails is None or mode == "off" else cls(guardrails, mode)

    def chain(self, principal: str | None) -> tuple[Guard, ...]:
        """The guards of the client chain of `principal` that look at results."""
        return tuple(guard for guard in self.guardrails.for_client(principal) if guard.after is not None)

    async def guard(self, places: Sequence[ResultPlace], principal: str | None,
                    trajectory_id: str | None = None) -> dict[str, GuardedResult]:
        """Every result of `places` checked, and what the mode applies written into the body; the
        decisions by call id (of a call id given twice, the later result's). Decisions kept are
        looked up at once; only the texts not seen before wait for the chain."""
        chain = self.chain(principal) if places else ()
        if not chain:
            return {}
        decided: list[Checked | None] = []
        unseen: list[tuple[int, ResultPlace, str, bytes]] = []
        for place in places:
            text = text_of(place.holder.get(place.key), place.text_type)
            key = verdict_key(principal, place.tool or UNKNOWN_TOOL, text) if text is not None else b""
            checked = self.verdicts.get(key) if text is not None else None
            if text is not None and checked is None:
                unseen.append((len(decided), place, text, key))
            decided.append(checked)
        if unseen:
            slots = asyncio.Semaphore(CONCURRENT_CHECKS)
            done = await asyncio.gather(*(self._fresh(chain, place, text, key, principal, trajectory_id, slots)
                                          for _, place, text, key in unseen))
            for (index, *_), checked in zip(unseen, done, strict=True):
                decided[index] = checked
        found: dict[str, GuardedResult] = {}
        for place, checked in zip(places, decided, strict=True):
            if checked is not None:  # None: nothing a guardrail can read, left as it is
                _apply(place, checked)
                found[place.call_id] = GuardedResult(place.tool, checked.records, checked.hidden)
        return found

    async def _fresh(self, chain: Sequence[Guard], place: ResultPlace, text: str, key: bytes,
                     principal: str | None, trajectory_id: str | None, slots: asyncio.Semaphore) -> Checked:
        """The chain on a text not seen before, its decisions kept unless a guardrail failed."""
        tool = place.tool or UNKNOWN_TOOL
        call = GuardedCall(tool, place.call_id, _arguments(place.arguments), "client", principal, trajectory_id)
        async with slots:
            checked = await self._checked(chain, call, text)
        if not any(record.failed for record in checked.records):
            self.verdicts.put(key, checked)
        return checked

    async def _checked(self, chain: Sequence[Guard], call: GuardedCall, text: str) -> Checked:
        """The chain on one text, as the mode has it."""
        if self.mode == "block":
            after = await self.guardrails.after(chain, call, text)
            return Checked(after.records, after.hidden, after.result if after.decision == "mask" else None,
                           after.message if after.decision == "block" else None)
        records: list[GuardrailRecord] = []
        hidden: list[str] = []
        current = text
        for guard in chain:  # one guard at a time: a block is recorded and the rest still run
            after = await self.guardrails.after((guard,), call, current)
            records += after.records
            hidden += after.hidden
            if self.mode == "mask" and after.decision == "block" and any(r.failed for r in after.records):
                # a guardrail that could not check the text, under guardrail_failure deny: unchecked
                # text does not reach the provider, whatever the mode (a guardrail's own block
                # is recorded only)
                return Checked(tuple(records), tuple(hidden), None, after.message)
            if after.decision == "mask" and after.result is not None:
                current = after.result
        applied = current if self.mode == "mask" and current != text else None
        return Checked(tuple(records), tuple(hidden), applied)


def _apply(place: ResultPlace, checked: Checked) -> None:
    """What the mode applies of `checked`, written into the body."""
    content = place.holder.get(place.key)
    if not isinstance(content, str | list):
        return
    if checked.withheld is not None:
        place.holder[place.key] = withheld(content, checked.withheld, place.text_type)
    elif checked.text is not None:
        place.holder[place.key] = masked(content, checked.text, place.text_type)
