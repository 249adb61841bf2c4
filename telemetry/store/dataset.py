"""A dataset of the recorded tool calls (`toolspan trajectories export --format chat-jsonl`): one JSON
object a line, in OpenAI's chat format that fine-tuning and eval tools read, with what happened to
each call. Its contract is telemetry.store.dataset_schema; docs/datasets.md describes each field.

- One example per call (the default): the conversation the model saw (the captured input of the turn
  that made the call) and its answer, the assistant message making the call, last; the tools that
  turn offered; and labels: the outcome, why it was rejected, what the model was told, whether it
  retried an earlier failure, and of a failed call a later call corrected, the corrected arguments
  (following the retries: a verbatim retry that failed again passes the correction on).
- One example per correction (`--pairs`): a failed call and the call that corrected it (an ok call
  whose retry link names it): the conversation up to the correcting call, which holds the failed
  call and what the model was told of it, and the corrected call as the final assistant message.

Where the messages were not captured, an example holds the calls alone (`context: not_captured`),
rebuilt from the recorded arguments; a call with neither is left out (counted).

The trajectories are those `toolspan trajectories list` lists for the same filters
(report.matching_trajectories); within them --tool, --outcome and --model keep the calls of that tool,
outcome and model (of a pair, the failed call's). Values under the redact keys are masked again."""

from __future__ import annotations

import json
import sqlite3
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from telemetry.arguments import mask_text, masked
from telemetry.store.chat_format import (
    Message,
    calls_in,
    captured_arguments,
    chat_messages,
    decoded_arguments,
    finite,
    function_tools,
    tool_call,
    tool_message,
)
from telemetry.store.records import split_stored_id
from telemetry.store.report import FAILED, matching_trajectories
from telemetry.store.rows import rows

Row = dict[str, Any]
_CALL_FIELDS = ("span_id", "trace_id", "request_span_id", "round", "tool", "call_id", "outcome", "rejection_reason",
                "error_type", "retry_kind", "retries_span_id", "diagnostic", "arguments", "side", "started")
_TURN_FIELDS = ("span_id", "request_span_id", "round", "started", "model", "upstream", "input_messages",
                "output_messages", "tool_definitions")


@dataclass(frozen=True)
class Selection:
    """Which calls: the filters of `toolspan trajectories list` (None: any)."""

    tool: str | None = None
    outcome: str | None = None
    since: float | None = None
    model: str | None = None
    key: str | None = None
    limit: int | None = None  # trajectories, the newest first


@dataclass(frozen=True)
class Written:
    examples: int
    left_out: int  # calls with neither captured messages nor recorded arguments


class _Trajectory:
    """One trajectory's calls and model turns, and how they link: the turn that made each call,
    the call that retried each failed one."""

    def __init__(self, stored_id: str, calls: list[Row], turns: list[Row]) -> None:
        self.id = stored_id
        self.calls = calls
        self._turns = turns  # in the order they started
        self._answered = [calls_in(turn["output_messages"]) for turn in turns]
        self._holding: dict[str, list[int]] = {}  # a call id: the turns whose answer holds it, in order
        for index, answered in enumerate(self._answered):
            for call_id in answered:
                self._holding.setdefault(call_id, []).append(index)
        self._starts = {call_id: [turns[i]["started"] for i in held] for call_id, held in self._holding.items()}
        self._by_round = {(turn["request_span_id"], turn["round"]): index for index, turn in enumerate(turns)}
        self._retried_by = {call["retries_span_id"]: call for call in calls if call["retries_span_id"]}

    def turn(self, call: Row) -> Row | None:
        """The turn that made `call`. A model may give the calls of different turns one id (`call_0`
        every round), so an id alone does not say which: its request's turn of its round, when that
        turn's captured answer holds the id; else the latest turn started at or before the call
        whose answer holds it (a round the store lacks); else its round's turn (answers not captured)."""
        call_id = str(call["call_id"])
        own = self._by_round.get((call["request_span_id"], call["round"]))
        if own is not None and call_id in self._answered[own]:
            return self._turns[own]
        before = bisect_right(self._starts.get(call_id, []), call["started"])
        if before:
            return self._turns[self._holding[call_id][before - 1]]
        return self._turns[own] if own is not None else None

    def retried_by(self, call: Row) -> Row | None:
        return self._retried_by.get(call["span_id"])

    def corrected_by(self, call: Row) -> Row | None:
        """Of a failed call, the ok call that at last corrected it, following the retries."""
        seen, at = set(), call
        while at["outcome"] in FAILED and at["span_id"] not in seen:
            seen.add(at["span_id"])
            retry = self.retried_by(at)
            if retry is None:
                return None
            at = retry
        return at if at is not call and at["outcome"] == "ok" and at["retry_kind"] == "corrected" else None


def _turn_columns(db: sqlite3.Connection) -> str:
    """The turn fields to select; a column a store of an older schema lacks reads as NULL."""
    present = {row[1] for row in db.execute("PRAGMA table_info(model_turns)")}
    return ", ".join(name if name in present else f"NULL AS {name}" for name in _TURN_FIELDS)


def _trajectories(db: sqlite3.Connection, selection: Selection) -> Iterator[_Trajectory]:
    turn_columns = _turn_columns(db)
    found = matching_trajectories(db, tool=selection.tool, outcome=selection.outcome, since=selection.since,
                                  model=selection.model, limit=selection.limit, key=selection.key)
    for stored_id, _, _ in found:
        calls = rows(db, f"SELECT {', '.join(_CALL_FIELDS)} FROM tool_calls WHERE trajectory_id = ? ORDER BY started",
                     _CALL_FIELDS, (stored_id,))
        turns = rows(db, f"SELECT {turn_columns} FROM model_turns WHERE trajectory_id = ? ORDER BY started",
                     _TURN_FIELDS, (stored_id,))
        yield _Trajectory(stored_id, calls, turns)


# --- one example --------------------------------------------------------------------------------

def _captured(turn: Row | None, call_id: Any, keys: Sequence[str]) -> list[Message] | None:
    """The conversation up to and including the turn's answer, when it was captured and holds the call."""
    if turn is None or not isinstance(turn["input_messages"], list) or str(call_id) not in calls_in(
            turn["output_messages"]):
        return None
    return chat_messages([*turn["input_messages"], *turn["output_messages"]], keys)


def _arguments(call: Row, turn: Row | None) -> Any:
    """The call's arguments: as recorded on its span, else as its turn's captured answer holds them."""
    if call["arguments"] is not None:
        return decoded_arguments(call["arguments"])
    for message in turn["output_messages"] if turn is not None and isinstance(turn["output_messages"], list) else ():
        for part in message.get("parts") or () if isinstance(message, dict) else ():
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("id") == call["call_id"]:
                return captured_arguments(part.get("arguments"))
    return None


def _assistant(call: Row, arguments: Any, keys: Sequence[str]) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [tool_call(call["call_id"], call["tool"], arguments,
                                                                           keys)]}


def _source(trajectory: _Trajectory, call: Row, turn: Row | None, corrected: Row | None) -> dict[str, Any]:
    return {"trajectory_id": trajectory.id, "key": split_stored_id(trajectory.id)[0],
            "model": turn["model"] if turn else None, "upstream": turn["upstream"] if turn else None,
            "tool": call["tool"], "side": call["side"], "call_id": call["call_id"], "span_id": call["span_id"],
            "trace_id": call["trace_id"], "round": call["round"], "started": call["started"],
            "corrected_call_id": corrected["call_id"] if corrected else None,
            "corrected_span_id": corrected["span_id"] if corrected else None}


def _labels(call: Row, retry_kind: Any, arguments: Any, corrected_arguments: Any, context: str, example: str,
            keys: Sequence[str]) -> dict[str, Any]:
    diagnostic = call["diagnostic"]
    return {"example": example, "outcome": call["outcome"], "rejection_reason": call["rejection_reason"],
            "error_type": call["error_type"], "retry_kind": retry_kind,
            "diagnostic": mask_text(diagnostic, keys) if diagnostic is not None else None,
            "arguments": masked(arguments, keys), "corrected_arguments": masked(corrected_arguments, keys),
            "context": context}


def _tools(turn: Row | None, keys: Sequence[str]) -> list[dict[str, Any]]:
    return function_tools(turn["tool_definitions"], keys) if turn is not None else []


def call_example(trajectory: _Trajectory, call: Row, keys: Sequence[str]) -> dict[str, Any] | None:
    """One call's example; None when neither its messages nor its arguments were recorded."""
    turn = trajectory.turn(call)
    arguments = _arguments(call, turn)
    messages = _captured(turn, call["call_id"], keys)
    if messages is None and arguments is None:
        return None
    corrected = trajectory.corrected_by(call)
    corrected_arguments = _arguments(corrected, trajectory.turn(corrected)) if corrected else None
    context = "not_captured" if messages is None else "captured"
    return {"messages": messages or [_assistant(call, arguments, keys)], "tools": _tools(turn, keys),
            "labels": _labels(call, call["retry_kind"], arguments, corrected_arguments, context, "call", keys),
            "source": _source(trajectory, call, turn, corrected)}


def pair_example(trajectory: _Trajectory, failed: Row, corrected: Row, keys: Sequence[str]) -> dict[str, Any] | None:
    """A failed call and the call that corrected it; None when the calls cannot be shown."""
    turn, failed_turn = trajectory.turn(corrected), trajectory.turn(failed)
    arguments, corrected_arguments = _arguments(failed, failed_turn), _arguments(corrected, turn)
    captured = _captured(turn, corrected["call_id"], keys)
    if captured is None and (arguments is None or corrected_arguments is None):
        return None
    told = failed["diagnostic"] or str(failed["outcome"])  # what the model was told, or how the call ended
    messages = captured or [_assistant(failed, arguments, keys), tool_message(failed["call_id"], told, keys),
                            _assistant(corrected, corrected_arguments, keys)]
    context = "not_captured" if captured is None else "captured"
    return {"messages": messages, "tools": _tools(turn or failed_turn, keys),
            "labels": _labels(failed, corrected["retry_kind"], arguments, corrected_arguments, context, "pair", keys),
            "source": _source(trajectory, failed, failed_turn or turn, corrected)}


# --- the dataset ----------------------------------------------------------------------------------

def _kept(trajectory: _Trajectory, call: Row, selection: Selection) -> bool:
    """Whether the call passes the call filters (--tool, --outcome, --model)."""
    turn = trajectory.turn(call)
    return ((selection.tool is None or call["tool"] == selection.tool)
            and (selection.outcome is None or call["outcome"] == selection.outcome)
            and (selection.model is None or (turn is not None and turn["model"] == selection.model)))


def examples(db: sqlite3.Connection, selection: Selection, *, pairs: bool = False,
             redact_keys: Sequence[str] = ()) -> Iterator[dict[str, Any] | None]:
    """The dataset's examples, in the trajectories' order (the newest first) and their calls'; None
    for a call that cannot be shown (neither messages nor arguments recorded)."""
    for trajectory in _trajectories(db, selection):
        for call in trajectory.calls:
            if not _kept(trajectory, call, selection):
                continue
            if not pairs:
                yield call_example(trajectory, call, redact_keys)
            elif call["outcome"] in FAILED and (retry := trajectory.retried_by(call)) is not None \
                    and retry["outcome"] == "ok" and retry["retry_kind"] == "corrected":
                yield pair_example(trajectory, call, retry, redact_keys)


def _line(example: dict[str, Any]) -> str:
    try:
        line = json.dumps(example, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a number JSON has not, where another writer stored one
        line = json.dumps(finite(example), ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return line.replace("\x7f", "\\u007f")


def export(db: sqlite3.Connection, out: IO[str], selection: Selection | None = None, *, pairs: bool = False,
           redact_keys: Sequence[str] = ()) -> Written:
    """Writes the dataset to `out`, one example a line: ASCII JSON, DEL escaped too (JSON escapes
    the other controls), so a line is safe on any terminal; JSON, NaN and Infinity never written
    bare (the arguments holding them are their text; anything else, `finite`)."""
    written = left_out = 0
    for example in examples(db, selection or Selection(), pairs=pairs, redact_keys=redact_keys):
        if example is None:
            left_out += 1
            continue
        out.write(_line(example) + "\n")
        written += 1
    return Written(written, left_out)
