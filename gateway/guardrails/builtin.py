"""The built-in guardrails, which need no service: secrets, result_size, denied_values, url_hosts
and injection. Each is cheap and bounded (`inline`): it runs on the event loop for small texts.

(Skeleton: the real detectors replace these.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from gateway.guardrails.verdicts import GuardedCall, Guardrail, Verdict, deny, mask

BUILTIN_NAMES = ("secrets", "result_size", "denied_values", "url_hosts", "injection")
MASK = "[REDACTED]"


@dataclass(frozen=True)
class BuiltinOptions:
    """The settings the built-ins read (guardrail_* in gateway.settings.model)."""

    max_result_bytes: int = 1024 * 1024
    denied_values: dict[str, list[str]] = field(default_factory=dict)
    allowed_url_hosts: list[str] = field(default_factory=list)
    injection: Literal["flag", "block"] = "flag"


_AWS = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")


class Secrets(Guardrail):
    name = "secrets"
    inline = True

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        found = _AWS.findall(repr(dict(call.arguments)))
        if found:
            return deny("The arguments hold a credential (an AWS access key); credentials may not be passed to tools.",
                        hidden=tuple(found))
        return None

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        found = _AWS.findall(result)
        if found:
            return mask(_AWS.sub(MASK, result), "credentials masked (an AWS access key)", hidden=tuple(found))
        return None


def make_builtin(name: str, options: BuiltinOptions) -> Guardrail | None:
    """The built-in guardrail named `name`, configured by `options`; None for another name."""
    if name == "secrets":
        return Secrets()
    return None
