"""The stdio transport of the MCP servers the gateway runs as processes.

It yields the `(read_stream, write_stream)` pair the `mcp` Client takes, as the SDK's
`mcp.client.stdio.stdio_client` does, with what a broken or hostile server makes necessary:

- A message is one line, and a line longer than `max_message_bytes` is not buffered: the read
  stream gets `MessageTooLarge` and closes, and the connection is dropped (the gateway reconnects).
  Lines are split by asyncio's StreamReader, which scans each byte once; the SDK joins each chunk
  to the unfinished line (`buffer + chunk`), which copies a long message once per chunk.
- The server runs in a session, hence a process group, of its own, so that signals reach the
  processes it starts. Closing is bounded whatever the server does: its stdin is closed, then the
  group gets SIGTERM, then SIGKILL, each after a grace. A close that is itself cancelled (the
  gateway stopping while a connection is being torn down) kills the group at once rather than
  abandoning it: no server outlives the gateway's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

log = logging.getLogger("toolspan.mcp")

GRACE_SECONDS = 2.0  # for the server to exit once its stdin is closed, and again once it got SIGTERM
_REAP_SECONDS = 2.0  # for a SIGKILLed group to be gone; only a process stuck in the kernel outlasts it
_FLUSH_SECONDS = 0.5  # for the messages already accepted to reach the server before its stdin closes
_POLL_SECONDS = 0.01  # how often a closing server is checked for (no event tells when a group is gone)
_DISCARD_BYTES = 64 * 1024
_LONG_LINE_BYTES = 1024 * 1024

Received = SessionMessage | Exception


class MessageTooLarge(Exception):
    """The server sent a message longer than the cap; what followed it is not to be trusted."""


@dataclass(frozen=True)
class StdioServer:
    """What starts one MCP server over stdio; `name` is the configured one, for the log."""

    name: str
    command: str
    args: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None
    max_message_bytes: int


@asynccontextmanager
async def stdio_transport(server: StdioServer) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Received],
                                                                      MemoryObjectSendStream[SessionMessage]]]:
    """Start the server and speak newline-delimited JSON-RPC with it; stop it on leaving."""
    process = await asyncio.create_subprocess_exec(
        server.command, *server.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=get_default_environment() | dict(server.env), cwd=server.cwd, start_new_session=True,
        limit=server.max_message_bytes)
    # No await from here to the `try`: a cancellation in between would leave the process running.
    received_in, received = anyio.create_memory_object_stream[Received](0)  # no read-ahead past one line
    sent, sent_out = anyio.create_memory_object_stream[SessionMessage](0)
    assert process.stdout is not None
    assert process.stdin is not None
    reader = asyncio.create_task(_read(process.stdout, received_in, server), name=f"mcp {server.name} stdout")
    writer = asyncio.create_task(_write(process.stdin, sent_out, received_in), name=f"mcp {server.name} stdin")
    try:
        yield received, sent
    finally:
        closing = asyncio.ensure_future(_close(process, server.name, reader, writer, received, sent))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:  # a close cut short (the gateway stopping meanwhile) ends the server now
            _signal_group(process.pid, signal.SIGKILL)
            for task in (closing, reader, writer):
                task.cancel()
            raise


async def _read(stdout: asyncio.StreamReader, sink: MemoryObjectSendStream[Received], server: StdioServer) -> None:
    """Deliver the server's messages until its stdout ends, a message is too long, or nobody reads
    them any more; then discard what it still writes, so that a server blocked on a full pipe can
    see its stdin close and exit."""
    with sink:
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # the StreamReader's limit: no newline within max_message_bytes
                log.warning("MCP server %r sent a message longer than %d bytes (mcp_max_message_bytes); "
                            "dropping the connection", server.name, server.max_message_bytes)
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await sink.send(MessageTooLarge(f"the server sent a message longer than "
                                                    f"{server.max_message_bytes} bytes (mcp_max_message_bytes)"))
                break
            except OSError:
                break
            if not line:
                return
            if len(line) > _LONG_LINE_BYTES:
                # Copying a long line out of the reader and parsing it each hold the event loop a
                # while: in two steps of the event loop, not one, other requests get in between.
                await asyncio.sleep(0)
            try:
                await sink.send(_parse(line))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
    with contextlib.suppress(OSError):
        while await stdout.read(_DISCARD_BYTES):
            pass


def _parse(line: bytes) -> Received:
    """One line as a JSON-RPC message; a line that is not one is handed on as the error it is."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # pydantic's ValidationError, invalid JSON and bad UTF-8 alike
        return exc


async def _write(stdin: asyncio.StreamWriter, source: MemoryObjectReceiveStream[SessionMessage],
                 received_in: MemoryObjectSendStream[Received]) -> None:
    try:
        with source:
            async for message in source:
                stdin.write(message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                await stdin.drain()
    except OSError:  # the server closed its stdin, or exited
        # It may still be running: ending the read stream tells the session the connection is gone,
        # rather than leaving a request waiting for an answer that cannot come.
        received_in.close()


async def _close(process: asyncio.subprocess.Process, name: str, reader: asyncio.Task[None],
                 writer: asyncio.Task[None], received: MemoryObjectReceiveStream[Received],
                 sent: MemoryObjectSendStream[SessionMessage]) -> None:
    """Flush what was sent, stop the server (bounded), then end the pipe tasks."""
    sent.close()
    await asyncio.wait([writer], timeout=_FLUSH_SECONDS)
    received.close()  # the reader turns to discarding
    await _stop(process, name)
    for task in (reader, writer):
        task.cancel()
    await asyncio.gather(reader, writer, return_exceptions=True)


async def _stop(process: asyncio.subprocess.Process, name: str) -> None:
    """Close the server's stdin, which asks it to exit (MCP's stdio shutdown); after each grace,
    escalate: SIGTERM to its process group, then SIGKILL."""
    assert process.stdin is not None
    process.stdin.close()
    if await _gone(process, GRACE_SECONDS):
        return
    log.info("MCP server %r did not exit within %g s of its stdin closing; sending SIGTERM to its processes",
             name, GRACE_SECONDS)
    _signal_group(process.pid, signal.SIGTERM)
    if await _gone(process, GRACE_SECONDS):
        return
    log.warning("MCP server %r did not exit within %g s of SIGTERM; killing its processes", name, GRACE_SECONDS)
    _signal_group(process.pid, signal.SIGKILL)
    if not await _gone(process, _REAP_SECONDS):
        log.warning("MCP server %r (process %d) is still there after SIGKILL; leaving it", name, process.pid)


async def _gone(process: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the server's whole process group is gone within `seconds`. (Not `process.wait()`,
    which also waits for the pipes to close: a process that inherited them could hold that up.)"""
    deadline = asyncio.get_running_loop().time() + seconds
    while _group_alive(process.pid):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECONDS)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal, or one not yet reaped: not proof it is gone
        pass
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # The server leads its own session, so its pid is the group's id, even after it exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
