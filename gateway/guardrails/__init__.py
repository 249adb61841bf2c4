"""Guardrails on tool calls: checks of a call's arguments before it runs and of its result before
the model reads it, for the gateway's tools, MCP servers' tools and the client's own
(docs/guardrails.md)."""

from gateway.guardrails.catalog import Guardrails
from gateway.guardrails.chain import After, Before, Chains, Guard
from gateway.guardrails.verdicts import (
    GuardedCall,
    Guardrail,
    GuardrailRecord,
    Verdict,
    allow,
    ask,
    block,
    deny,
    flag,
    mask,
    rewrite,
)

__all__ = ["After", "Before", "Chains", "Guard", "GuardedCall", "Guardrail", "GuardrailRecord", "Guardrails",
           "Verdict", "allow", "ask", "block", "deny", "flag", "mask", "rewrite"]
