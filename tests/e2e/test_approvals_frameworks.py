"""Agent frameworks survive approvals (issue 38): the OpenAI Agents SDK (Chat Completions and
Responses), LangGraph (a graph of langchain-openai's ChatOpenAI and LangGraph's ToolNode) and
pydantic-ai (its OpenAI chat model), each with a tool of its own and pointed at the gateway, run a
scripted model that calls the gateway's `pay` (approval=True), then the framework's own tool, then
answers with what it was told. Approved through /v1/approvals, denied, or left to time out, the run
ends with an ordinary final answer, run plain and streamed (a timed-out stream certainly carried
keep-alive comments to the framework's SSE parser while it waited).

Before approvals (interrupt_mode = "hand_back"), the gateway handed the `pay` call to the framework,
which never declared it: the Agents SDK aborts the run (ModelBehaviorError "Tool pay not found in
agent payer"); LangGraph's ToolNode answers "Error: pay is not a valid tool, try one of
[lookup_secret]." and pydantic-ai '{"error":"Unknown tool name: 'pay'. Available tools: ..."}', each
of which the gateway takes as `pay`'s result: the run ends, the payment never ran, nobody was asked."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import openai
import pytest
from agents import Agent, ModelBehaviorError, function_tool
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from playwright.async_api import Browser, expect
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai import Tool as PydanticTool
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider as PydanticOpenAIProvider

from gateway.demo.model import Reply
from tests.conftest import (
    PAID,
    STREAM,
    TEST_KEY,
    Stack,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    pending,
    while_asking,
)
from tests.e2e.test_agents_sdk import SECRET, final_output, results_by_tool, run_config

PROMPT = "Pay ACME 12.5, then tell me the door secret."


def paying_model(body: dict[str, Any]) -> Reply:
    """Calls the gateway's `pay`, then the framework's `lookup_secret`, then says what each returned."""
    told = results_by_tool(body)
    if "pay" not in told:
        return Reply(tool_calls=[("pay", {"to": "ACME", "amount": 12.5})])
    if "lookup_secret" not in told:
        return Reply(tool_calls=[("lookup_secret", {"name": "door"})])
    return Reply(content=f"pay: {told['pay']} | secret: {told['lookup_secret']}")


def lookup_secret(name: str) -> str:
    """Look up a secret by name.

    Args:
        name: which secret
    """
    return SECRET if name == "door" else "unknown"


# --- each framework's run, to its final answer --------------------------------------------------------

async def agents_sdk(stack: Stack, stream: bool, api: str) -> str:
    agent = Agent(name="payer", instructions="Be brief.", model="test-model",
                  tools=[function_tool(lookup_secret)])
    answer: str = await final_output(agent, PROMPT, run_config(stack, api), stream)
    return answer


async def langgraph(stack: Stack, stream: bool) -> str:
    """A ReAct graph built from LangGraph's parts (its prebuilt create_react_agent is deprecated)."""
    tools = [langchain_tool(lookup_secret)]
    async with openai.DefaultAsyncHttpxClient() as http:  # closed with the test, not a module-wide one
        model = ChatOpenAI(model="test-model", base_url=f"{stack.url}/v1", api_key=TEST_KEY, max_retries=0,
                           timeout=20, streaming=stream, http_async_client=http).bind_tools(tools)

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", call_model)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        state = await graph.compile().ainvoke(MessagesState(messages=[HumanMessage(PROMPT)]))
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    return last.text


async def pydantic_ai(stack: Stack, stream: bool) -> str:
    """Streamed: an event stream handler makes each of the agent's model requests a stream."""
    model = OpenAIChatModel("test-model", provider=PydanticOpenAIProvider(openai_client=stack.client))
    agent = PydanticAgent(model, instructions="Be brief.", tools=[PydanticTool(lookup_secret, takes_ctx=False)])

    async def drain(_: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for _event in events:
            pass

    result = await agent.run(PROMPT, event_stream_handler=drain if stream else None)
    answer: str = result.output
    return answer


FRAMEWORKS: dict[str, Callable[[Stack, bool], Awaitable[str]]] = {
    "agents-chat": lambda stack, stream: agents_sdk(stack, stream, "chat"),
    "agents-responses": lambda stack, stream: agents_sdk(stack, stream, "responses"),
    "langgraph": langgraph,
    "pydantic-ai": pydantic_ai,
}
FRAMEWORK = pytest.mark.parametrize("framework", list(FRAMEWORKS))


def streamed(stack: Stack) -> bool:
    """Whether the framework's requests were streams (the gateway asks its upstream as it was asked)."""
    [streams] = {bool(body.get("stream")) for body in stack.upstream_requests}
    return streams


async def paying_stack(make_stack: StackFactory, approval_timeout: float | None = None, **settings: Any) -> Stack:
    stack = await make_stack(registry=approval_registry(approval_timeout), keepalive_seconds=0.05, **settings)
    stack.script.then(paying_model, paying_model, paying_model)
    PAID.clear()
    return stack


# --- the three ends of a wait ------------------------------------------------------------------------

@FRAMEWORK
@STREAM
async def test_an_approved_payment_runs_and_the_framework_gets_its_answer(make_stack: StackFactory, framework: str,
                                                                          stream: bool) -> None:
    stack = await paying_stack(make_stack)

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (approval["tool"], approval["arguments"]) == ("pay", {"to": "ACME", "amount": 12.5})
        assert PAID == []  # nothing paid before the decision
        assert (await decide(stack, approval["id"], decision="approve"))[0] == 200

    answer = await while_asking(lambda: FRAMEWORKS[framework](stack, stream), reviewer)
    assert answer == f"pay: paid 12.5 to ACME | secret: {SECRET}"
    assert PAID == [{"to": "ACME", "amount": 12.5}]
    assert len(stack.upstream_requests) == 3  # pay, the framework's own tool, the answer
    assert streamed(stack) is stream
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="approve") == 1
    assert await pending(stack) == []


@FRAMEWORK
@STREAM
async def test_a_denied_payment_ends_the_run_normally_and_the_model_hears_why(make_stack: StackFactory,
                                                                              framework: str, stream: bool) -> None:
    stack = await paying_stack(make_stack)

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (await decide(stack, approval["id"], decision="deny", reason="over the limit"))[0] == 200

    answer = await while_asking(lambda: FRAMEWORKS[framework](stack, stream), reviewer)
    assert answer == f"pay: denied by the reviewer: over the limit | secret: {SECRET}"
    assert PAID == []
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="deny") == 1
    assert await pending(stack) == []


@FRAMEWORK
@STREAM
async def test_nobody_deciding_ends_the_run_normally_and_the_model_is_told(make_stack: StackFactory, framework: str,
                                                                           stream: bool) -> None:
    stack = await paying_stack(make_stack, approval_timeout=0.3)
    answer = await FRAMEWORKS[framework](stack, stream)
    assert answer.startswith("pay: Tool 'pay' needed a reviewer's approval, and nobody decided within 0.3 s")
    assert answer.endswith(f" | secret: {SECRET}")
    assert streamed(stack) is stream  # streamed: keep-alive comments every 0.05 s of the 0.3 s wait
    assert PAID == []
    assert stack.metric("toolspan_approval_decisions_total", tool="pay", decision="timeout") == 1
    assert await pending(stack) == []


# --- what each did before: hand-back mode, the call given to a framework that never declared it ------

async def test_hand_back_mode_aborts_an_agents_sdk_run(make_stack: StackFactory) -> None:
    stack = await paying_stack(make_stack, interrupt_mode="hand_back")
    with pytest.raises(ModelBehaviorError, match="Tool pay not found"):
        await agents_sdk(stack, False, "chat")
    assert PAID == []


@pytest.mark.parametrize(("framework", "told"), [
    ("langgraph", "Error: pay is not a valid tool, try one of [lookup_secret]."),
    ("pydantic-ai", """{"error":"Unknown tool name: 'pay'. Available tools: 'lookup_secret'"}"""),
])
async def test_hand_back_mode_gives_the_frameworks_unknown_tool_text_as_the_result(make_stack: StackFactory,
                                                                                  framework: str, told: str) -> None:
    stack = await paying_stack(make_stack, interrupt_mode="hand_back")
    answer = await FRAMEWORKS[framework](stack, False)
    assert answer == f"pay: {told} | secret: {SECRET}"  # the framework's refusal taken for pay's result
    assert PAID == []  # nothing paid, and nobody asked


async def test_an_agents_sdk_run_approved_on_the_page_in_the_browser(make_stack: StackFactory,
                                                                     browser: Browser) -> None:
    """The reviewer is a person on /ui/approvals, in the real headless Chromium."""
    stack = await paying_stack(make_stack)

    async def reviewer() -> None:
        await first_pending(stack)
        page = await (await browser.new_context()).new_page()
        await page.goto(f"{stack.url}/ui/approvals")
        card = page.locator("section.approval")
        await expect(card.locator("code.tool")).to_have_text("pay")
        async with page.expect_navigation():
            await card.get_by_role("button", name="Approve").click()
        await expect(page.locator("main")).to_contain_text("No approval is pending.")

    answer = await while_asking(lambda: agents_sdk(stack, True, "chat"), reviewer)
    assert answer == f"pay: paid 12.5 to ACME | secret: {SECRET}"
    assert PAID == [{"to": "ACME", "amount": 12.5}]
