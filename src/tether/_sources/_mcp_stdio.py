"""The stdio transport to an MCP server: the SDK's ``stdio_client`` with a reader that is linear and bounded.

The SDK's reader joins each chunk read from the server to the partial line before
it (``(buffer + chunk).split("\\n")``), so one long line costs time quadratic in its
length, all of it on the event loop: a 60 MB answer held every run and request of
the host for 34 s of 38, and no line was too long to hold. Here each chunk is
scanned once, the parts of a partial line are joined once, and a line past
``MESSAGE_LIMIT`` ends the connection (the call reads as lost, the next call
connects again). Process start and teardown are the SDK's own (mcp is pinned).
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
import anyio.lowlevel
from mcp.client.stdio import (
    _WRITER_FLUSH_TIMEOUT,
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

__all__ = ["MESSAGE_LIMIT", "stdio_transport"]

# One message from a server, as characters: what an OpenAPI answer may be (RESPONSE_LIMIT), and far past
# what a journaled result may keep (1 MiB by default), so no answer a run could use is refused here.
MESSAGE_LIMIT = 64 << 20


@asynccontextmanager
async def stdio_transport(server: StdioServerParameters, errlog: TextIO = sys.stderr,
                          limit: int = MESSAGE_LIMIT) -> AsyncIterator[tuple[object, object]]:
    """``(read_stream, write_stream)`` to a server started from ``server``; stopped on exit."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=errlog, cwd=server.cwd)
    # No awaits until the task group is entered: a cancellation in the gap would leak the process.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        decoder = codecs.getincrementaldecoder(server.encoding)(errors=server.encoding_error_handler)
        partial: list[str] = []
        held = 0
        try:
            async with read_stream_writer:
                try:
                    async for data in process.stdout:
                        *lines, rest = decoder.decode(data).split("\n")
                        if lines:
                            lines[0] = "".join([*partial, lines[0]])
                            partial, held = [], 0
                        for line in lines:
                            try:
                                await read_stream_writer.send(_parse_line(line))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return
                        if rest:
                            partial.append(rest)
                            held += len(rest)
                        if held > limit:
                            print(f"tether: the MCP server sent a message over {limit >> 20} MiB; "
                                  "the connection is closed", file=errlog, flush=True)
                            # Closed before the drain below: the session must see the end now, not
                            # when the server stops writing.
                            await read_stream_writer.aclose()
                            return
                finally:
                    await _drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # shutdown closed the pipe under the read, or the server went: the session sees the end

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_stream_reader:
                async for message in write_stream_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode(server.encoding, server.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()  # the session sees the end instead of a request hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await _stop_server_process(process)
        await _aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            # Every wait in shutdown is bounded; shielded so a cancelled caller cannot leak the server.
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
