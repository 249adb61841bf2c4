"""Guardrails of the tests' own, for the client's tools (gateway.guardrails): settings name them
by import path (`tests.client_tools.guards:Credentials`), unit tests pass instances. They need no
built-in's detectors: a "live key" is `sk-live-` and at least eight letters or digits."""

from __future__ import annotations

import json
import re

from gateway.guardrails import GuardedCall, Guardrail, Verdict, block, deny, mask

LIVE_KEY = re.compile(r"sk-live-[A-Za-z0-9]{8,}")
EXAMPLE_KEY = "sk-live-abcdef123456"
MASKED = "[REDACTED]"
QUARANTINED = "QUARANTINE"  # a result holding this is blocked


class Credentials(Guardrail):
    """Denies a call whose arguments carry a live key; masks live keys in results. `seen`: the
    texts it was shown, for tests that count its work."""

    name = "credentials"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.calls: list[GuardedCall] = []

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        self.calls.append(call)
        found = LIVE_KEY.findall(json.dumps(dict(call.arguments)))
        if found:
            return deny("The arguments carry a live key: name the key's variable instead of its value.",
                        hidden=tuple(found))
        return None

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        self.seen.append(result)
        self.calls.append(call)
        found = LIVE_KEY.findall(result)
        if found:
            return mask(LIVE_KEY.sub(MASKED, result), "a live key masked", hidden=tuple(found))
        return None


class Quarantine(Guardrail):
    """Blocks a result that holds the word QUARANTINE."""

    name = "quarantine"

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        return block("The result is quarantined.") if QUARANTINED in result else None
