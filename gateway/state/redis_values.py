"""Reading back what the gateway wrote into Redis. Anyone with access to Redis can put anything
under the gateway's keys (another program sharing the database, an operator's hand, a version of
the gateway that wrote another shape, a partial restore): every value is checked for the shape it
was written in, and one that is not that shape is unreadable, which the store treats as missing.
`UnreadableValues` counts each one and says which key it was."""

from __future__ import annotations

import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from gateway.state.base import HeldTurn, StateKind
from gateway.wire.headers import is_trajectory_id

log = logging.getLogger("toolspan.state")

WRONG_TYPE = "another Redis type (WRONGTYPE)"
MISSING = "treated as missing until it expires, is written again or is deleted"
REPLACED = "replaced by what the gateway writes there"
_TOKEN = re.compile(rb"[0-9a-f]{1,64}")  # what `hold` makes (secrets.token_hex), with room to grow


class Unreadable(ValueError):
    """A value that is not what the gateway writes there; `reason` says how, in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def wrong_type(answer: object) -> bool:
    """Whether a command's answer is Redis's WRONGTYPE error: the key holds another type than the
    command reads (a list where a string was written). Redis answered, so it is garbage in the
    key, not a store that cannot answer. redis-py raises it as a plain ResponseError (and rewrites
    its message inside pipelines), so only the message tells it from other errors."""
    return type(answer) is ResponseError and "WRONGTYPE" in str(answer)


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8") from None


def _no_constant(name: str) -> Any:
    raise Unreadable(f"not JSON ({name})")  # json.dumps never writes NaN or Infinity here


def _objects(value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise Unreadable("not a held turn: its messages or items are not a list of objects")
    return tuple(value)


def turn_json(turn: HeldTurn) -> str:
    """A held turn as Redis holds it (`turn_of` reads it back)."""
    whole = {"before": turn.before} if turn.before else {}
    return json.dumps({"api": turn.api, "calls": turn.calls, "results": turn.results, "shown": turn.shown, **whole},
                      separators=(",", ":"))


def turn_of(raw: bytes) -> HeldTurn:
    """The held turn `turn_json` wrote. The standard library's parser, as the writer's: it reads
    back every string json.dumps writes (lone surrogates included)."""
    try:
        data = json.loads(_text(raw), parse_constant=_no_constant)
    except RecursionError:
        raise Unreadable("not JSON (nested too deep)") from None
    except json.JSONDecodeError:
        raise Unreadable("not JSON") from None
    if not isinstance(data, dict) or data.get("api") not in ("chat", "responses", "messages"):
        raise Unreadable("not a held turn: no object naming its API")
    shown = data.get("shown")
    if not isinstance(shown, list) or not all(isinstance(s, str) for s in shown):
        raise Unreadable("not a held turn: its shown ids are not a list of strings")
    return HeldTurn(data["api"], _objects(data.get("calls")), _objects(data.get("results")), tuple(shown),
                    _objects(data.get("before", [])))


def token_of(raw: bytes) -> str:
    """The token of a held turn a shown item belongs to."""
    if _TOKEN.fullmatch(raw) is None:
        raise Unreadable("not a held turn's token")
    return raw.decode("ascii")


def response_of(raw: bytes) -> str:
    """The provider response id a client-facing response id stands for."""
    text = _text(raw)
    if not text or not text.isprintable():
        raise Unreadable("not a response id")
    return text


def upstream_of(raw: bytes) -> str:
    """The configured upstream a provider response was made by."""
    text = _text(raw)
    if not text or not text.isprintable() or len(text) > 64:
        raise Unreadable("not an upstream's name")
    return text


def trajectory_of(raw: bytes) -> str:
    """The trajectory a linked call or response id belongs to (gateway.routes.linking writes one the
    gateway accepts)."""
    text = _text(raw)
    if not is_trajectory_id(text):
        raise Unreadable("not a trajectory id")
    return text


def sent_of(raw: bytes) -> str:
    """The record of a client call handed back (gateway.client_tools.results writes a JSON array,
    and treats one it cannot read as absent)."""
    text = _text(raw)
    if not text.startswith("["):
        raise Unreadable("not a sent call's record")
    return text


def rounds_of(raw: bytes) -> str:
    """The rounds kept for a replay (gateway.engine.replays writes a JSON object, and treats one
    whose fields it cannot read as absent)."""
    text = _text(raw)
    if not text.startswith("{"):
        raise Unreadable("not a record of rounds")
    return text


def answer_of(raw: bytes) -> str:
    """A record of what a client was given (gateway.routes.answer_records writes a JSON object; its
    fields are gateway.routes.response_ids' to read)."""
    text = _text(raw)
    if not text.startswith("{"):
        raise Unreadable("not a record of an answer")
    return text


def thread_of(raw: bytes) -> str:
    """A Messages thread's record (gateway.apis.messages.threads writes a JSON object, and treats
    one whose fields it cannot read as absent)."""
    text = _text(raw)
    if not text.startswith("{"):
        raise Unreadable("not a record of a thread")
    return text


def owned_json(owned: bool) -> str:
    """A response owner's entry as Redis holds it: only the key that made the response writes one."""
    return "1"


def owned_of(raw: bytes) -> bool:
    """A response owner's entry (`owned_json`)."""
    if raw != b"1":
        raise Unreadable("not an owner's mark")
    return True


def written_at(raw: bytes) -> float:
    """When a failure record was written: the number its value starts with."""
    stamp, _, _ = raw.partition(b" ")
    try:
        value = float(stamp)
    except ValueError:
        raise Unreadable("no time before the failure record") from None
    if not math.isfinite(value):
        raise Unreadable("no time before the failure record")
    return value


def failure_record(raw: bytes) -> str:
    """The failure record after its time (the record's own shape is telemetry's to read)."""
    written_at(raw)
    return _text(raw).partition(" ")[2]


class UnreadableValues:
    """Counts every unreadable value read (`count`, a metric: the rate an alert watches) and logs
    each key found unreadable once. Once per key, not once per read: a broken key is read by
    every request that names it, and one line per request would bury the rest of the log; nor once
    per kind: the operator needs the name of each broken key to look at it or delete it, and a
    second broken key is news. The keys logged are remembered up to `remembered` (least recently
    seen forgotten first), so this memory is bounded however many keys break."""

    def __init__(self, count: Callable[[StateKind], None], remembered: int = 1024) -> None:
        self._count = count
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered

    def __call__(self, kind: StateKind, key: str, reason: str, outcome: str = MISSING) -> None:
        """One unreadable value of `kind` at `key`; `outcome` says what the gateway does with it."""
        self._count(kind)
        if key in self._logged:
            self._logged.move_to_end(key)
            return
        self._logged[key] = None
        if len(self._logged) > self._remembered:
            self._logged.popitem(last=False)
        # The key is the gateway's own name (prefix, kind, digests): nothing a caller chose.
        log.warning("the state store (Redis) holds an unreadable %s entry at %s (%s): %s", kind, key, reason, outcome)
