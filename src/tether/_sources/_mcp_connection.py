"""One connection to an MCP server, and knowing whether a call's request left this process.

A connection lives in a task of its own (:class:`Connection`) because the SDK's transports hold anyio task
groups and cancel scopes, which must be exited by the task that entered them. Its streams are watched: the
write stream counts each call's ``tools/call`` requests handed to the transport (:class:`UpstreamCall`), so
a call on a connection that died is retried only when its request provably never left (see
:mod:`tether._sources.mcp`); the read stream reports the connection's end as soon as it is read.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import Client
from mcp.types import JSONRPCRequest

from tether._tools.clocks import CallClocks

# The source's own logger: a connection's end is reported as the source's.
logger = logging.getLogger("tether._sources.mcp")


# --- knowing whether a call left this process ---------------------------------


@dataclass(eq=False)
class UpstreamCall:
    tool: str
    sent: int = 0  # tools/call requests handed to the transport for this call
    clocks: CallClocks | None = None  # its deadlines, held while its question is with a person (D-89)
    # Ends the call now: set while it is on the wire, used when its server asks after its question budget (D-91).
    end: Callable[[], None] | None = None
    questions: float = 0.0  # questions its server put while it was on the wire (a share of each it may have put)
    ended_why: str | None = None  # why its questions ended it (D-91)


current_upstream_call: contextvars.ContextVar[UpstreamCall | None] = contextvars.ContextVar("tether_mcp_call", default=None)


class _WatchedWrite:
    """Write-stream wrapper that counts each handler's ``tools/call`` requests.

    The dispatcher writes a request from the calling task, so the handler's
    context variable is visible here; that is how a call learns whether its
    request was ever handed over, which the SDK's CONNECTION_CLOSED error
    alone cannot tell.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: Any, /) -> None:
        call = current_upstream_call.get()
        message = getattr(item, "message", None)
        counted = call is not None and isinstance(message, JSONRPCRequest) and message.method == "tools/call"
        if counted:
            call.sent += 1  # type: ignore[union-attr]
        try:
            await self._inner.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The transport was already gone and refused the item: it never left.
            if counted:
                call.sent -= 1  # type: ignore[union-attr]
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedWrite:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _WatchedRead:
    """Read-stream wrapper that reports the end of the stream (the server exited
    or the transport failed) as soon as the dispatcher reads it, so the next
    call goes to a fresh connection instead of into a dead one."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> contextvars.Context | None:
        # The dispatcher runs server requests in the sender's context (HTTP).
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


@asynccontextmanager
async def watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedRead(read_stream, on_end), _WatchedWrite(write_stream)


# --- one connection ------------------------------------------------------------


class ConnectTimeout(Exception):
    pass


class SourceTimeout(TimeoutError):
    """A call this source timed out itself; passes through as a timeout, with its reason."""


class Connection:
    """A client session living in its own task until :meth:`shutdown`."""

    def __init__(
        self,
        make_client: Callable[[Callable[[], None]], Client],
        connect_timeout: float,
        label: str,
        on_end: Callable[[Connection], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        self.client = make_client(self._ended)
        self._on_end = on_end
        self.ready: asyncio.Future[None] = loop.create_future()
        # A waiter cancelled by its caller's timeout leaves nobody to read a
        # later connect failure; read it here so asyncio does not warn.
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.broken = False
        self.in_flight: set[UpstreamCall] = set()
        self._scope = anyio.CancelScope()
        self._watchdog = loop.call_later(connect_timeout, self._connect_timed_out)
        self.task = loop.create_task(self._own(), name=f"tether-mcp-{label}")

    def _connect_timed_out(self) -> None:
        if not self.ready.done():
            # Fail waiters now; the teardown (up to a few seconds for a server
            # that ignores stdin closing) continues in the background.
            self.ready.set_exception(ConnectTimeout())
            self._scope.cancel()

    async def _own(self) -> None:
        try:
            # Cancelling this scope (shutdown, connect timeout) lets the SDK run
            # its shielded teardown: stdin closed, then SIGTERM/SIGKILL of the
            # server's process group, so no orphan survives.
            with self._scope:
                async with self.client:
                    self._watchdog.cancel()
                    if not self.ready.done():  # the watchdog may have fired this very turn
                        self.ready.set_result(None)
                    await anyio.sleep_forever()
        except Exception as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            else:
                logger.warning("MCP connection %s ended: %s", self.task.get_name(), describe(exc))
        finally:
            self._watchdog.cancel()
            self.broken = True
            if not self.ready.done():
                self.ready.set_exception(ConnectionError("connect aborted"))

    @property
    def live(self) -> bool:
        ready = self.ready
        return ready.done() and not ready.cancelled() and ready.exception() is None and not self.broken

    def _ended(self) -> None:
        if not self.broken:
            self.broken = True
            self._on_end(self)

    def shutdown(self) -> None:
        self.broken = True
        self._scope.cancel()


# --- describing a failure -----------------------------------------------------


def leaf(exc: BaseException) -> BaseException:
    # anyio task groups wrap transport failures; the leaf is the useful part.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    exc = leaf(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
