"""The built-in guardrails, which need no service, by name:

- `secrets` (builtin_secrets): a call whose arguments hold a credential is denied; credentials in
  a result are masked.
- `result_size` (here): a result longer than guardrail_max_result_bytes (UTF-8) is cut to fit,
  with a note at its end saying how much was cut.
- `denied_values` (builtin_values): a call carrying an argument value that matches a pattern of
  guardrail_denied_values for its tool is denied.
- `url_hosts` (builtin_values): a call whose URL-named arguments name a host outside
  guardrail_allowed_url_hosts is denied.
- `injection` (builtin_injection): a result with prompt-injection markers is flagged, or blocked
  (guardrail_injection).

Each is cheap and bounded (`inline`): a scan linear in the text, no network, no state between
calls; chain.py runs it on the event loop for texts up to INLINE_MAX_CHARS and on a thread beyond.
Order matters in a chain: list `secrets` before `result_size`, so that a credential is masked
whole before a cut could leave part of it unrecognised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.guardrails.builtin_injection import Injection
from gateway.guardrails.builtin_secrets import MASK, Secrets
from gateway.guardrails.builtin_values import DeniedValues, UrlHosts
from gateway.guardrails.verdicts import GuardedCall, Guardrail, Verdict, mask

BUILTIN_NAMES = ("secrets", "result_size", "denied_values", "url_hosts", "injection")
UTF8_MAX_BYTES_PER_CHAR = 4

__all__ = ["BUILTIN_NAMES", "MASK", "BuiltinOptions", "ResultSize", "make_builtin"]


@dataclass(frozen=True)
class BuiltinOptions:
    """The settings the built-ins read (guardrail_* in gateway.settings.model)."""

    max_result_bytes: int = 1024 * 1024
    denied_values: dict[str, list[str]] = field(default_factory=dict)
    allowed_url_hosts: list[str] = field(default_factory=list)
    injection: Literal["flag", "block"] = "flag"


def _note(cut: int, total: int) -> str:
    return f"\n[toolspan: the result was cut here; {cut} of its {total} bytes (UTF-8) were left out]"


class ResultSize(Guardrail):
    """Cuts a result longer than `max_bytes` (UTF-8) to fit, the note saying so included. The note
    is always kept whole: with a limit smaller than the note, the result is the note alone."""

    name = "result_size"
    inline = True

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        if len(result) * UTF8_MAX_BYTES_PER_CHAR <= self._max:  # short enough without encoding it
            return None
        data = result.encode("utf-8", "surrogatepass")
        total = len(data)
        if total <= self._max:
            return None
        kept = max(0, self._max - len(_note(total, total).encode()))  # the longest note this cut can have
        while kept and data[kept] & 0xC0 == 0x80:  # not inside a character: back to where it starts
            kept -= 1
        head = data[:kept].decode("utf-8", "surrogatepass")
        return mask(head + _note(total - kept, total), f"result cut from {total} to at most {self._max} bytes")


def make_builtin(name: str, options: BuiltinOptions) -> Guardrail | None:
    """The built-in guardrail named `name`, configured by `options`; None for another name. A
    ValueError when `options` cannot configure it (a listed host that is no host)."""
    if name == "secrets":
        return Secrets()
    if name == "result_size":
        return ResultSize(options.max_result_bytes)
    if name == "denied_values":
        return DeniedValues(options.denied_values)
    if name == "url_hosts":
        return UrlHosts(options.allowed_url_hosts)
    if name == "injection":
        return Injection(options.injection)
    return None
