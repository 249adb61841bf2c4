"""The built-in scripted model: an OpenAI-compatible upstream that answers by rules.

`ScriptedModel(policy)` serves /v1/chat/completions, /v1/responses and /v1/messages (JSON or SSE;
Messages with its beta `thread`)
and a few plain routes. The policy sees each chat request body (and a Chat-shaped view of each
Responses and Messages request)
and returns a `Reply`; `DemoPolicy` plays an agent that renames an argument, reads the gateway's
diagnostic, corrects itself and answers. Tests script their own.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from gateway.demo.messages import (
    MessagesRefused,
    Threads,
    build_message,
    chat_view,
    check_messages,
    error_event,
    message_events,
)
from gateway.demo.reply import Reply
from gateway.demo.responses import (
    Conversations,
    RequestRefused,
    arguments_text,
    build_response,
    chat_request,
    check_chat_request,
    input_messages,
    pieces,
    response_events,
)

__all__ = ["Policy", "Reply", "ScriptedModel"]

Policy = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]


class ScriptedModel:
    """An in-process upstream. `requests` and `request_headers` keep the last `keep` chat and
    Responses bodies and headers it received, in order (bounded: `toolspan serve` may run it for
    days); so do the conversations kept for `previous_response_id`."""

    def __init__(self, policy: Policy, model_name: str = "toolspan-scripted", keep: int = 1000,
                 stores_responses: bool = False, apis: Collection[str] = ("chat", "responses", "messages"),
                 first_id: int = 1) -> None:
        self.policy = policy
        # The wire APIs it serves: ("chat", "responses") plays OpenAI, which has no /v1/messages (a 404).
        self.apis = frozenset(apis)
        # Stored responses answered as a provider answers them (GET, input_items, DELETE; 404 for an id it
        # never made or has deleted), rather than echoed.
        self.stores_responses = stores_responses
        self.model_name = model_name
        self.keep = keep
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.request_paths: list[str] = []  # path and query string of each
        self.base_url: str | None = None  # set by whoever serves it
        self._ids = itertools.count(first_id)  # several of them in one test: ids apart, as providers' are
        self.conversations = Conversations(keep)
        self.threads = Threads(keep)  # Messages' beta `thread`: the conversations it holds
        self.paused = asyncio.Event()  # a stream reached its `pause_after` point
        self.dropped = asyncio.Event()  # a paused stream's connection was then closed by its client

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        if "chat" in self.apis:
            app.router.add_post("/v1/chat/completions", self._chat)
        if "responses" in self.apis:
            app.router.add_post("/v1/responses", self._responses)
        if "messages" in self.apis:
            app.router.add_post("/v1/messages", self._messages)
            app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        # As an Azure OpenAI resource names them (the deployment is the model).
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._chat)
        app.router.add_post("/openai/v1/responses", self._responses)
        app.router.add_post("/openai/v1/chat/completions", self._chat)
        app.router.add_post("/openai/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/echo", self._echo)
        if self.stores_responses:
            app.router.add_route("GET", "/v1/responses/{id}", self._stored)
            app.router.add_route("DELETE", "/v1/responses/{id}", self._stored)
            app.router.add_route("GET", "/v1/responses/{id}/input_items", self._stored)
        app.router.add_route("*", "/v1/responses/{tail:.+}", self._echo)  # stored responses: echoed
        app.router.add_route("*", "/openai/{tail:.+}", self._echo)  # an Azure resource's other routes: echoed
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "toolspan"}]})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's token count, as a scripted model counts: a token for every four bytes."""
        return web.json_response({"input_tokens": max(1, len(await request.read()) // 4)})

    async def _echo(self, request: web.Request) -> web.Response:
        """Answers with the request body, for pass-through tests (with the status an
        `X-Echo-Status` header asks for)."""
        status = int(request.headers.get("X-Echo-Status", "200"))
        return web.Response(status=status, body=await request.read(), content_type=request.content_type,
                            headers={"X-Echo-Method": request.method, "X-Echo-Path": request.path_qs,
                                     "openai-organization": "org-scripted"})  # as OpenAI's answers carry

    async def _stored(self, request: web.Request) -> web.Response:
        """A stored response, as the provider keeps it: found, listed or deleted; a 404 when unknown."""
        response_id = request.match_info["id"]
        if not self.conversations.knows(response_id):
            return web.json_response({"error": {"message": f"Response with id '{response_id}' not found.",
                                                "type": "invalid_request_error", "param": None, "code": None}},
                                     status=404)
        if request.method == "DELETE":
            self.conversations.forget(response_id)
            return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})
        if request.path.endswith("/input_items"):
            return web.json_response({"object": "list", "data": [], "first_id": None, "last_id": None,
                                      "has_more": False})
        return web.json_response({"id": response_id, "object": "response", "status": "completed"})

    async def _received(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        self.request_paths.append(request.path_qs)
        if len(self.requests) > self.keep:
            del self.requests[0], self.request_headers[0], self.request_paths[0]
        return body

    async def _ask(self, view: dict[str, Any], anthropic: bool = False) -> tuple[Reply, web.Response | None]:
        """The policy's reply, and the whole answer when the reply leaves nothing to build (an
        error in Anthropic's shape for a Messages request)."""
        reply = self.policy(view)
        if inspect.isawaitable(reply):
            reply = await reply
        if reply.hang:
            await asyncio.Event().wait()
        if reply.raw is not None and (reply.status != 200 or not view.get("stream")):
            return reply, web.Response(status=reply.status, body=reply.raw, content_type=reply.raw_type,
                                       headers=reply.headers)
        if reply.status != 200:
            error: dict[str, Any] = {"error": {"message": reply.error, "type": "scripted_error", "param": None,
                                               "code": None}}
            if anthropic:
                error = error_event(reply.status, reply.error)
            return reply, web.json_response(error, status=reply.status, headers=reply.headers)
        return reply, None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._received(request)
        try:
            check_chat_request(body)
        except RequestRefused as refused:
            return web.json_response(refused.body(), status=400)
        reply, answered = await self._ask(body)
        if answered is not None:
            return answered
        completion_id = f"chatcmpl-scripted-{next(self._ids)}"
        calls = [{"id": f"call_{completion_id[-6:]}_{i}", "type": "function",
                  "function": {"name": name, "arguments": arguments_text(arguments)}}
                 for i, (name, arguments) in enumerate(reply.tool_calls)]
        if body.get("stream"):
            return await self._stream(request, reply, _events(body, reply, completion_id, calls, self.model_name))
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        prompt, completion = reply.usage
        return web.json_response({
            "id": completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model_name),
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish(), "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }, headers=reply.headers)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API: the policy answers a Chat-shaped view of the request."""
        body = await self._received(request)
        try:
            view, conversation = chat_request(body, self.conversations.before(body.get("previous_response_id")),
                                              self.model_name)
        except RequestRefused as refused:
            return web.json_response(refused.body(), status=400)
        reply, answered = await self._ask(view)
        if answered is not None:
            return answered
        response = build_response(body, reply, next(self._ids), self.model_name)
        if response["store"]:
            self.conversations.add(response["id"], [*conversation, *input_messages(response["output"])])
        if body.get("stream"):
            return await self._stream(request, reply, response_events(response))
        return web.json_response(response, headers=reply.headers)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API: the policy answers a Chat-shaped view of the request."""
        body = await self._received(request)
        try:
            whole = self.threads.whole(body)
            check_messages(whole)
        except MessagesRefused as refused:
            return web.json_response(refused.body(), status=refused.status)
        reply, answered = await self._ask(chat_view(whole, self.model_name), anthropic=True)
        if answered is not None:
            return answered
        message = build_message(whole, reply, next(self._ids), self.model_name)
        self.threads.answered(body, whole, message)
        if body.get("stream"):
            return await self._stream(request, reply, message_events(message))
        return web.json_response(message, headers=reply.headers)

    async def _stream(self, request: web.Request, reply: Reply, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
        await response.prepare(request)
        if reply.raw is not None:
            events = [b"data: " + reply.raw + b"\n\n"]
        if reply.raw_stream is not None:
            events = [reply.raw_stream]
        for count, event in enumerate(events):
            if reply.break_stream_after is not None and count >= reply.break_stream_after:
                assert request.transport is not None
                request.transport.close()  # an abrupt end, as when a provider's connection drops
                return response
            if reply.pause_after is not None and count >= reply.pause_after:
                await self._stall()
            await response.write(event)
        await response.write_eof()
        return response

    async def _stall(self) -> None:
        self.paused.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # the server cancels a handler whose client hung up
            self.dropped.set()
            raise


def _events(body: dict[str, Any], reply: Reply, completion_id: str, calls: list[dict[str, Any]],
            model_name: str) -> list[bytes]:
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body.get("model", model_name)}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in pieces(reply.content or "") if reply.content]
    for index, call in enumerate(calls):
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in pieces(call["function"]["arguments"])]
    chunks.append(chunk({}, reply.finish()))
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        prompt, completion = reply.usage
        chunks.append({**base, "choices": [], "usage": {
            "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
