"""Guardrails of the tests' own, as an operator writes them: the settings name them by import path
(`tests.e2e.guards:no_prod_hosts`), and the gateway imports them at start-up. Also the tools they
guard: a deploy tool that records where it ran, and tools whose results hold an AWS access key id."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.guardrails import GuardedCall, Guardrail, Verdict, ask, deny, rewrite
from gateway.tools import Param, Tool, ToolRegistry

# An AWS access key id (AKIA and 16 upper-case letters and digits): what every secrets detector finds.
AWS_KEY = "AKIA" + "Q7RZ2M4XW9KD3HPL"
PROD = ".prod.example.com"
STAGING = ".staging.example.com"


def _host(call: GuardedCall) -> str:
    host = call.arguments.get("host")
    return host if isinstance(host, str) else ""


class NoProdHosts(Guardrail):
    """Denies a call whose `host` is a production host, saying what to use instead."""

    name = "no_prod_hosts"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        host = _host(call)
        if host.endswith(PROD):
            return deny(f"{host} is a production host; use its staging host ({host.removesuffix(PROD)}{STAGING})")
        return None


no_prod_hosts = NoProdHosts()  # an instance, as an operator may name one


class StagingInstead(Guardrail):
    """Rewrites a production `host` into its staging host."""

    name = "staging_instead"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        host = _host(call)
        if host.endswith(PROD):
            return rewrite({**call.arguments, "host": host.removesuffix(PROD) + STAGING}, "production host rewritten")
        return None


class DropsTheHost(Guardrail):
    """Rewrites every call into one without its required `host`: arguments the tool refuses."""

    name = "drops_the_host"

    def before_execute(self, call: GuardedCall) -> Verdict:
        return rewrite({name: value for name, value in call.arguments.items() if name != "host"})


class AskForProd(Guardrail):
    """A call to a production host waits for a reviewer."""

    name = "ask_for_prod"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        return ask("a deploy to production needs a reviewer") if _host(call).endswith(PROD) else None


class Raises(Guardrail):
    """A guardrail whose policy service is down: it raises on every call."""

    name = "raises"

    def before_execute(self, call: GuardedCall) -> Verdict:
        raise ConnectionError("the policy service is down")


class RaisesAfter(Guardrail):
    """Raises on every result."""

    name = "raises_after"

    def after_execute(self, call: GuardedCall, result: str) -> Verdict:
        raise ConnectionError("the policy service is down")


class Stalls(Guardrail):
    """Never answers: only guardrail_timeout_seconds ends it."""

    name = "stalls"

    async def before_execute(self, call: GuardedCall) -> Verdict | None:
        await asyncio.Event().wait()
        return None


def deploy_registry(ran: list[str], **tool: Any) -> ToolRegistry:
    """A `deploy` tool whose body records the host it ran for in `ran`; `tool`: more of Tool's fields."""

    def deploy(args: dict[str, Any]) -> str:
        ran.append(args["host"])
        return f"deployed to {args['host']}"

    return ToolRegistry([Tool(name="deploy", description="Deploy the service to a host", function=deploy,
                              parameters=[Param("host", "string", required=True)], **tool)])


def config_text(name: str) -> str:
    """What a config file of the tests holds: a region and an AWS access key id."""
    return f"[{name}]\nregion = eu-west-1\naws_access_key_id = {AWS_KEY}\n"


def config_tool(name: str, **tool: Any) -> Tool:
    """A tool `name` that reads a config file holding an AWS access key id."""
    return Tool(name=name, description="Read a config file", function=lambda args: config_text(str(args["file"])),
                parameters=[Param("file", "string", required=True)], **tool)
