"""Tools from an MCP server, reached over stdio (a subprocess) or streamable HTTP.

One connection per source is shared by every call. It is owned by a dedicated
asyncio task because the SDK's transports hold anyio task groups and cancel
scopes, which must be exited by the task that entered them; handlers run in
whatever task the effect boundary gives them and only send requests through it.

Safety rule for dead connections: a call is retried on a fresh connection only
when its ``tools/call`` request provably never reached the transport. Once it
may have left this process the outcome is unknown, and the call fails with
``details["code"] == "upstream_disconnected"`` instead of being sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    URL_ELICITATION_REQUIRED,
    AudioContent,
    CallToolResult,
    ElicitResult,
    EmbeddedResource,
    ErrorData,
    ImageContent,
    Implementation,
    ResourceLink,
    TextContent,
)
from pydantic import BaseModel

from tether._sources._mcp_connection import Connection as _Connection
from tether._sources._mcp_connection import ConnectTimeout as _ConnectTimeout
from tether._sources._mcp_connection import SourceTimeout as _SourceTimeout
from tether._sources._mcp_connection import UpstreamCall as _Call
from tether._sources._mcp_connection import current_upstream_call as _current_call
from tether._sources._mcp_connection import describe as _describe
from tether._sources._mcp_connection import leaf as _leaf
from tether._sources._mcp_connection import watched as _watched
from tether._sources._mcp_links import link_for_a_person, url_required
from tether._sources._mcp_progress import ProgressGate
from tether._sources._mcp_stdio import stdio_transport
from tether._sources._mcp_tools import build_tools, listing_json, server_summary
from tether._sources.base import expand_env
from tether._sources.kinds import SourceContext
from tether._tools.clocks import CallClocks, call_deadline
from tether._tools.context import current_call
from tether._tools.model import IDEMPOTENCY_MODES, Tool, check_identifier
from tether._tools.shown import escape
from tether.errors import ConfigError, SourceNotStarted, SourceUnavailable, ToolError, UsageError

__all__ = ["ElicitationHandler", "ElicitationRequest", "ElicitationResponse", "MCPSource", "ProgressReport"]

logger = logging.getLogger(__name__)

# Long enough for a cold `npx`/`uvx` start that downloads the server on first
# use; a hung upstream still cannot hold a call longer than the caller's timeout.
DEFAULT_CONNECT_TIMEOUT = 60.0

# Where a tool call's idempotency key travels: the request's `_meta` (P-25).
# MCP reserves prefixes naming modelcontextprotocol/mcp; this one is tether's.
IDEMPOTENCY_META_KEY = "tether/idempotency-key"

# Enough for an error message to be actionable, short enough that a server
# dumping a traceback or a page of HTML cannot flood the program's context.
ERROR_MESSAGE_LIMIT = 2000

# How long an upstream's questions may wait for a person, in all for one call, before they are cancelled and
# the call's clocks run again: the reference server (server-everything) itself waits ten minutes for its answer.
QUESTION_SECONDS = 600.0
# A form larger than this is not one a person fills in (the reference server's 13 fields: 4 KiB).
QUESTION_SCHEMA_BYTES = 64 * 1024
# More questions than a person answers in one call (the reference server asks one): past it the call ends (D-91).
QUESTIONS_PER_CALL = 50

# A paginating server that never stops must not hang start().
_MAX_LIST_PAGES = 1000

# The SDK's own defaults for streamable HTTP: reads stay open for SSE streams.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


try:
    _VERSION = importlib.metadata.version("tether")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    _VERSION = "0"


# --- elicitation -------------------------------------------------------------


@dataclass(frozen=True)
class ElicitationRequest:
    """An upstream server asking for user input in the middle of a tool call.

    ``tool`` is the tether tool name of the call that asked, when it can be
    told: always on 2026-era connections (the request arrives inside the
    call), and on 2025-era connections when exactly one call is in flight on
    the source; otherwise ``None``.
    """

    namespace: str
    tool: str | None
    message: str
    mode: Literal["form", "url"]
    requested_schema: dict[str, Any] | None = None  # form mode
    url: str | None = None  # url mode
    elicitation_id: str | None = None  # url mode, 2025-era only


@dataclass(frozen=True)
class ElicitationResponse:
    """The answer to an :class:`ElicitationRequest`.

    ``content`` is sent only with ``action="accept"`` in form mode and must
    match the requested schema (flat: strings, numbers, booleans, lists of
    strings).
    """

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None


ElicitationHandler = Callable[[ElicitationRequest], Awaitable[ElicitationResponse]]


@dataclass(frozen=True)
class ProgressReport:
    """A ``notifications/progress`` the server sent during a tool call."""

    namespace: str
    tool: str
    progress: float
    total: float | None
    message: str | None


ProgressHandler = Callable[[ProgressReport], None]


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    async with httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


# --- the source ----------------------------------------------------------------


class MCPSource:
    """Tools served by one MCP server, under one tether namespace.

    Give either ``command`` (argv of a stdio server; ``env`` and ``cwd``
    optional) or ``url`` (a streamable-HTTP endpoint; ``headers`` optional).
    ``${NAME}`` in ``headers`` and ``env`` values is replaced by the environment
    variable at each connect, so secrets stay out of config files and never
    reach a program. ``elicitation_handler`` answers upstream requests for user
    input; without one they are declined. ``mode`` is the SDK's protocol
    negotiation: ``"auto"`` (2026-era when the server speaks it) or
    ``"legacy"`` (2025-era handshake only).

    Every tool call carries its idempotency key in the request's ``_meta``
    under ``"tether/idempotency-key"``. ``idempotency="key"`` says the server
    dedupes by that key, so tether may re-send a write whose outcome it lost
    (P-31); the server's ``idempotentHint`` alone never does.
    ``call_timeout`` bounds a call that sends no progress; each progress
    notification restarts it, up to ``max_call_seconds`` in all (both None:
    the caller bounds calls). Progress goes to ``progress_handler``. A stdio
    server's stderr goes to ``errlog`` (default: this process's stderr).

    Use ``await start()`` (connect and list tools), ``tools()``, then
    ``await close()``; or ``async with``.
    """

    def __init__(
        self,
        namespace: str,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        elicitation_handler: ElicitationHandler | None = None,
        mode: Literal["auto", "legacy"] = "auto",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        idempotency: str = "none",
        call_timeout: float | None = None,
        max_call_seconds: float | None = None,
        progress_handler: ProgressHandler | None = None,
        errlog: TextIO | None = None,
    ) -> None:
        try:
            check_identifier(namespace, "namespace")
        except UsageError as exc:
            raise ConfigError(exc.message) from None
        url = str(url) if url is not None else None  # config hands over pydantic URL objects
        if (command is None) == (url is None):
            raise ConfigError(f"MCP source {namespace!r}: give exactly one of 'command' (stdio) or 'url' (HTTP)")
        if command is not None:
            if isinstance(command, str) or not command or not all(isinstance(a, str) for a in command):
                raise ConfigError(f"MCP source {namespace!r}: 'command' must be a non-empty list of strings")
            if headers:
                raise ConfigError(f"MCP source {namespace!r}: 'headers' apply to 'url' sources only")
        if url is not None:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"MCP source {namespace!r}: 'url' must be an http(s) URL")
            if env or cwd is not None:
                raise ConfigError(f"MCP source {namespace!r}: 'env' and 'cwd' apply to 'command' sources only")
        if mode not in ("auto", "legacy"):
            raise ConfigError(f"MCP source {namespace!r}: 'mode' must be 'auto' or 'legacy', not {mode!r}")
        self.namespace = namespace
        self.elicitation_handler = elicitation_handler
        self.problems: list[dict[str, str]] = []
        self._command = list(command) if command is not None else None
        self._env = dict(env or {})
        self._cwd = os.fspath(cwd) if cwd is not None else None
        self._url = url
        self._headers = dict(headers or {})
        self._mode = mode
        self._connect_timeout = connect_timeout
        if idempotency not in IDEMPOTENCY_MODES:
            raise ConfigError(f"MCP source {namespace!r}: 'idempotency' must be 'none' or 'key', not {idempotency!r}")
        self._idempotency = idempotency
        self._call_timeout = call_timeout
        self._max_call_seconds = max_call_seconds
        self.progress_handler = progress_handler
        self._errlog = errlog
        self.listing: list[dict[str, Any]] = []
        self.server_info: dict[str, Any] = {}
        self._tools: list[Tool] | None = None
        self._upstream: dict[str, str] = {}
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    def __repr__(self) -> str:
        # Never the headers or env: they may hold resolved secrets' templates.
        target = f"command={self._command[0]!r}" if self._command else f"url={_redact_url(self._url or '')!r}"
        return f"MCPSource(namespace={self.namespace!r}, {target})"

    @property
    def summary(self) -> str | None:
        """The namespace's one line for sources() and the prompt (see :func:`server_summary`)."""
        return server_summary(self.server_info)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` has listed the tools (a dropped connection reconnects at the next call)."""
        return self._tools is not None

    async def __aenter__(self) -> MCPSource:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # -- lifecycle --

    async def start(self) -> None:
        """Connect, list every tool (following pagination) and build the tools.

        If it fails, nothing is left running (close() is still safe to call).
        """
        self._closed = False
        try:
            conn = await self._live()
            listed = await self._list(conn)
            self.server_info = _server_info(conn.client)
        except asyncio.CancelledError:
            raise  # teardown continues in the background; close() waits for it
        except BaseException:
            await self.close()
            raise
        self._tools = self._build_tools(listed)

    async def _list(self, conn: _Connection) -> list[Any]:
        listed: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        try:
            for _ in range(_MAX_LIST_PAGES):
                page = await conn.client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or cursor in seen:
                    return listed
                seen.add(cursor)
        except MCPError as exc:
            raise ToolError(
                f"MCP source {self.namespace!r}: tools/list failed: {_clip(exc.message)}",
                details={"source": self.namespace, "code": "rpc_error", "rpc_code": exc.code},
            ) from None
        raise ToolError(
            f"MCP source {self.namespace!r}: tools/list did not end after {_MAX_LIST_PAGES} pages",
            details={"source": self.namespace, "code": "invalid_listing"},
        )

    def tools(self) -> list[Tool]:
        """The tools listed at :meth:`start`."""
        if self._tools is None:
            raise SourceNotStarted(
                f"MCP source {self.namespace!r} is not started",
                next_action="Call and await start() before tools().",
            )
        return list(self._tools)

    async def ensure_live(self) -> None:
        """Connect now if no connection is open (a command that needs the server running)."""
        try:
            await self._live()
        except ConfigError as exc:
            raise SourceUnavailable(exc.message, details={"source": self.namespace}) from None

    async def call(self, name: str, upstream: str, args: dict[str, Any]) -> Any:
        """Call upstream tool ``upstream`` as tether tool ``name`` (what a tool's handler does)."""
        return await self._call(name, upstream, args)

    def upstream_name(self, name: str) -> str:
        """The upstream tool name behind tether tool ``name`` (names may be sanitised)."""
        return self._upstream[name]

    async def close(self) -> None:
        """Shut the connection down and wait until the server process is gone."""
        self._closed = True
        if self._conn is not None:
            self._retire(self._conn)
        pending = [t for t in self._retiring if not t.done()]
        if pending:
            # asyncio.wait, not gather: if close() is cancelled, the owner tasks
            # must still finish their shielded teardown rather than be cancelled.
            await asyncio.wait(pending)

    # -- connections --

    def _client(self, on_end: Callable[[], None]) -> Client:
        info = Implementation(name="tether", version=_VERSION)
        if self._command is not None:
            params = StdioServerParameters(
                command=self._command[0],
                args=self._command[1:],
                env={k: expand_env(v, f"env {k!r} of MCP source {self.namespace!r}") for k, v in self._env.items()},
                cwd=self._cwd,
            )
            transport = stdio_transport(params, errlog=self._errlog or sys.stderr)
        else:
            where = f"of MCP source {self.namespace!r}"
            headers = {k: expand_env(v, f"header {k!r} {where}") for k, v in self._headers.items()}
            transport = _http_transport(self._url or "", headers)
        return Client(
            _watched(transport, on_end),
            mode=self._mode,
            cache=None,  # listings are read once at start; no stale pages across reconnects
            client_info=info,
            elicitation_callback=self._on_elicit,
        )

    async def _live(self) -> _Connection:
        if self._closed:
            raise ToolError(
                f"MCP source {self.namespace!r} is closed",
                details={"source": self.namespace, "code": "source_closed"},
            )
        conn = self._conn
        if conn is None or conn.broken:
            async with self._lock:
                conn = self._conn
                if conn is None or conn.broken:
                    if conn is not None:
                        self._retire(conn)
                    conn = _Connection(self._client, self._connect_timeout, self.namespace, self._on_end)
                    self._conn = conn
        try:
            # Shielded: one caller's timeout must not abort a connect others share.
            await asyncio.shield(conn.ready)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._retire(conn)
            raise self._connect_error(exc) from None
        return conn

    @property
    def connected(self) -> bool:
        """Whether a live connection is open (it opens lazily after a loss)."""
        conn = self._conn
        return conn is not None and conn.live

    def _on_end(self, conn: _Connection) -> None:
        # Called from the dispatcher's read loop: retire on the next loop turn so
        # teardown (reaping the dead server) does not run inside that loop.
        asyncio.get_running_loop().call_soon(self._retire, conn)

    def _retire(self, conn: _Connection) -> None:
        if self._conn is conn:
            self._conn = None
        conn.shutdown()
        if not conn.task.done():
            self._retiring.add(conn.task)
            conn.task.add_done_callback(self._retiring.discard)

    def _connect_error(self, exc: BaseException) -> SourceUnavailable | ConfigError:
        exc = _leaf(exc)
        if isinstance(exc, ConfigError):
            return exc
        if isinstance(exc, (FileNotFoundError, PermissionError)) and self._command is not None:
            return ConfigError(f"MCP source {self.namespace!r}: cannot run {self._command[0]!r}: {exc.strerror}")
        if isinstance(exc, _ConnectTimeout):
            message, code = f"no answer within {self._connect_timeout:g}s while connecting", "connect_timeout"
        else:
            message, code = f"could not connect: {_describe(exc)}", "upstream_unavailable"
        return SourceUnavailable(
            f"MCP source {self.namespace!r}: {message}",
            next_action="Check that the MCP server starts and answers; nothing was sent to it.",
            details={"source": self.namespace, "code": code},
        )

    # -- tools --

    def _build_tools(self, listed: list[Any]) -> list[Tool]:
        self.listing = listing_json(listed)
        # The ceiling the effect boundary allows; the source times calls out itself first.
        ceiling = self._max_call_seconds or self._call_timeout
        tools, self._upstream, self.problems = build_tools(
            self.namespace, self.listing, self._handler, None if ceiling is None else ceiling + 1.0,
            # idempotentHint alone never allows a re-send (D-18): only a declared key does.
            idempotency=self._idempotency)
        return tools

    def _handler(self, name: str, upstream: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        async def handler(args: dict[str, Any]) -> Any:
            return await self._call(name, upstream, args)

        handler.__qualname__ = f"mcp:{self.namespace}.{name}"
        return handler

    async def _call(self, name: str, upstream: str, args: dict[str, Any]) -> Any:
        call = _Call(name)
        call.clocks = CallClocks()
        call.clocks.watch(call_deadline())
        token = _current_call.set(call)
        address = f"{self.namespace}.{name}"
        details = {"source": self.namespace, "tool": name, "upstream_tool": upstream}
        ctx = current_call()
        meta: Any = {IDEMPOTENCY_META_KEY: ctx.key} if ctx is not None else None
        try:
            for _attempt in (1, 2):
                try:
                    conn = await self._live()
                except ConfigError as exc:  # e.g. a ${VAR} unset since start: nothing was sent
                    raise SourceUnavailable(f"{address}: {exc.message}; the call was not sent",
                                            details={**details, "code": "source_unavailable"}) from None
                conn.in_flight.add(call)
                try:
                    return _result_value(await self._timed_call(conn, name, upstream, args, meta, call),
                                         address, details)
                except MCPError as exc:
                    if exc.code == URL_ELICITATION_REQUIRED:
                        message, links = url_required(address, exc.data, exc.message)
                        raise ToolError(
                            _clip(message),
                            next_action="Give the user the link; once they have finished there, call the tool "
                            "again (tether does not send it again by itself).",
                            details={**details, "code": "url_elicitation_required", "links": links},
                        ) from None
                    if exc.code != CONNECTION_CLOSED and not _session_gone(exc):
                        raise ToolError(
                            f"{address}: failed upstream: {_clip(exc.message)}",
                            details={**details, "code": "rpc_error", "rpc_code": exc.code},
                        ) from None
                    # A 404 for our session id means the server refused the
                    # request unprocessed, so it counts as never sent.
                    unsent = not call.sent or _session_gone(exc)
                except (ToolError, _SourceTimeout):
                    raise
                except Exception as exc:
                    if not (conn.broken and not call.sent):
                        # Output-schema validation, malformed payloads, input-required
                        # round limits: the upstream answered, but badly.
                        raise ToolError(
                            f"{address}: invalid answer from the MCP server: {_clip(_describe(exc))}",
                            details={**details, "code": "invalid_result"},
                        ) from None
                    unsent = True  # the connection was torn down under us before sending
                finally:
                    conn.in_flight.discard(call)
                self._retire(conn)
                if not unsent:
                    raise ToolError(
                        f"{address}: the connection to the MCP server was lost after the call was sent; "
                        "whether it took effect is unknown",
                        next_action="Check whether the call took effect before repeating it; "
                        "tether did not send it again.",
                        details={**details, "code": "upstream_disconnected", "outcome": "unknown"},
                    )
                call.sent = 0
            raise ToolError(
                f"{address}: the MCP server went away again after reconnecting; the call was not sent",
                details={**details, "code": "upstream_unavailable", "outcome": "not_sent"},
            )
        finally:
            _current_call.reset(token)

    async def _timed_call(self, conn: _Connection, name: str, upstream: str, args: dict[str, Any],
                          meta: Any = None, call: _Call | None = None) -> Any:
        loop = asyncio.get_running_loop()
        clocks = call.clocks if call is not None else None
        started = loop.time()
        limit = self._call_timeout
        ceiling = self._max_call_seconds or limit
        handler = self.progress_handler

        def deadline() -> float | None:
            if limit is None and ceiling is None:
                return None
            # Time a person spent answering the call's question is not the server's (D-89).
            held = clocks.held_seconds if clocks is not None else 0.0
            return min(loop.time() + (limit or ceiling), started + held + (ceiling or limit))  # type: ignore[operator]

        scope = asyncio.timeout_at(deadline())
        gate = ProgressGate(loop.time)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            # Progress means the server is working: the no-progress clock restarts (unless it is held).
            if clocks is None or not clocks.holding:
                scope.reschedule(deadline())
            if handler is not None and gate.allow():
                try:
                    handler(ProgressReport(self.namespace, name, progress, total, message))
                except Exception:  # a listener's failure must not fail the call
                    logger.exception("progress handler of MCP source %r failed", self.namespace)

        try:
            async with scope:
                if clocks is not None:
                    clocks.watch(scope)
                if call is not None:
                    call.end = lambda: _expire(scope)
                try:
                    return await conn.client.call_tool(upstream, args, progress_callback=on_progress, meta=meta)
                finally:
                    if call is not None:
                        call.end = None  # a scope left is not one to move
        except TimeoutError:
            if not scope.expired():
                raise
            if call is not None and call.ended_why is not None:
                raise _SourceTimeout(f"{call.ended_why}, so the call was ended; the server may still be working "
                                     "on it") from None
            waited = loop.time() - started
            ceiling_hit = limit is None or (ceiling is not None and waited >= ceiling - 0.05)
            why = f"no answer within {ceiling:g} s" if ceiling_hit else f"no answer or progress for {limit:g} s"
            # The boundary decides what a timeout means (a write's outcome is unknown).
            raise _SourceTimeout(f"{why}; the server may still be working on it") from None

    # -- elicitation --

    async def _on_elicit(self, context: Any, params: Any) -> ElicitResult | ErrorData:
        asking = self._eliciting_calls()
        for call in asking:
            # A 2025-era question that may be any of n calls' is a 1/n share of each: n calls asking once each
            # (a gather of forms) stay at one question apiece, one call asking for ever still reaches the bound.
            call.questions += 1 / len(asking)
        if _end_calls(asking, lambda c: c.questions > QUESTIONS_PER_CALL,
                      f"the server asked more than {QUESTIONS_PER_CALL} questions in one call"):
            # Declined or answered at once, a server asking again and again holds nothing: only a count ends it.
            return ElicitResult(action="cancel")
        handler = self.elicitation_handler
        if handler is None:
            return ElicitResult(action="decline")
        schema = getattr(params, "requested_schema", None)
        if isinstance(schema, BaseModel):
            schema = schema.model_dump(mode="json", by_alias=True, exclude_none=True)
        url = getattr(params, "url", None)
        if len(json.dumps(schema)) > QUESTION_SCHEMA_BYTES or (url is not None and not link_for_a_person(url)):
            # Not a form or a link for a person (a javascript: or data: URL, one that reads as another): not shown
            # to one, nor kept in the run's timeline (D-91).
            return ElicitResult(action="decline")
        request = ElicitationRequest(
            namespace=self.namespace,
            tool=self._eliciting_tool(),
            # Terminal escapes and bidi overrides are shown as text, on every surface that asks (D-91).
            message=_clip(escape(params.message[:ERROR_MESSAGE_LIMIT + 1], keep_lines=True)),
            mode="url" if getattr(params, "mode", "form") == "url" else "form",
            requested_schema=dict(schema) if schema is not None else None,
            url=url,
            elicitation_id=getattr(params, "elicitation_id", None),
        )
        # The call that asked, or (a 2025-era connection with several in flight) each that may have: their
        # deadlines stop while the person answers. One budget for all of a call's questions, or a server
        # asking again and again would hold its call's deadlines for ever.
        clocks = [c.clocks for c in asking if c.clocks is not None]
        wait = QUESTION_SECONDS - max((c.held_so_far() for c in clocks), default=0.0)
        if wait <= 0:
            # Told "cancel", a server may ask at once again (thousands of round trips a second) until the call's
            # deadline: the calls whose budget is spent end now instead, as a timeout (D-91).
            _end_calls(asking, lambda c: c.clocks is not None and c.clocks.held_so_far() >= QUESTION_SECONDS,
                       f"the server asked the user again after the call's {QUESTION_SECONDS:g} s for questions "
                       "were spent")
            return ElicitResult(action="cancel")
        try:
            try:
                with ExitStack() as hold:
                    for held in clocks:
                        hold.enter_context(held.held())
                    async with asyncio.timeout(wait):
                        answer = await handler(request)
            except TimeoutError:
                # Nobody answered: the upstream hears "cancel" and the call's clocks run again.
                return ElicitResult(action="cancel")
            if answer.action not in ("accept", "decline", "cancel"):
                raise ValueError(f"unknown action {answer.action!r}")
            content = answer.content if answer.action == "accept" and request.mode == "form" else None
            return ElicitResult(action=answer.action, content=content)
        except Exception:
            logger.exception("elicitation handler of MCP source %r failed", self.namespace)
            return ErrorData(code=INTERNAL_ERROR, message="the client failed to answer the elicitation")

    def _eliciting_tool(self) -> str | None:
        call = self._eliciting_call()
        return call.tool if call is not None else None

    def _eliciting_call(self) -> _Call | None:
        calls = self._eliciting_calls()
        return calls[0] if len(calls) == 1 else None

    def _eliciting_calls(self) -> list[_Call]:
        call = _current_call.get()
        if call is not None:
            return [call]
        conn = self._conn
        return list(conn.in_flight) if conn is not None else []


def _expire(scope: asyncio.Timeout) -> None:
    if not scope.expired():
        with contextlib.suppress(RuntimeError):  # expiring already: it ends the call as asked
            scope.reschedule(asyncio.get_running_loop().time())


def _end_calls(calls: list[_Call], over: Callable[[_Call], bool], why: str) -> bool:
    """End each of ``calls`` on the wire that is ``over`` its questions' bound, saying ``why`` (D-91); whether any."""
    ended = False
    for call in calls:
        if call.end is not None and over(call):
            call.ended_why = call.ended_why or why
            call.end()
            ended = True
    return ended


# --- results -------------------------------------------------------------------


def from_definition(definition: dict[str, Any], context: SourceContext) -> MCPSource:
    """An ``mcp`` source (tether._sources.kinds) from its recorded definition, not started yet."""
    namespace = definition["namespace"]
    return MCPSource(
        namespace=namespace, command=definition.get("command"), url=definition.get("url"),
        env=definition.get("env") or None, headers=definition.get("headers") or None,
        cwd=definition.get("cwd"), connect_timeout=context.timeout, idempotency=definition.get("idempotency", "none"),
        # With max_call_seconds, progress extends calls: the no-progress limit then
        # defaults to [limits] call_timeout_seconds (without it the boundary applies that).
        call_timeout=definition.get("call_timeout") or (
            context.default_call_timeout if definition.get("max_call_seconds") else None),
        max_call_seconds=definition.get("max_call_seconds"),
        elicitation_handler=context.ask(namespace) if context.ask is not None else None,
        progress_handler=context.progress,
        errlog=context.errlog(namespace) if definition.get("command") else None,
    )


def _result_value(result: CallToolResult, address: str, details: dict[str, Any]) -> Any:
    if result.is_error:
        texts = [b.text for b in result.content if isinstance(b, TextContent)]
        message = "\n".join(texts).strip() or "the tool reported an error without a message"
        raise ToolError(f"{address}: {_clip(message)}", details={**details, "code": "upstream_error"})
    if result.structured_content is not None:
        return result.structured_content
    values = [_block_value(block) for block in result.content]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _block_value(block: Any) -> Any:
    if isinstance(block, TextContent):
        # Text stays text: a tool that returns data says so with structuredContent.
        return block.text
    if isinstance(block, (ImageContent, AudioContent)):
        return {"type": block.type, "mime_type": block.mime_type, "data": block.data}
    if isinstance(block, EmbeddedResource):
        res = block.resource
        value: dict[str, Any] = {"type": "resource", "uri": str(res.uri), "mime_type": res.mime_type}
        if getattr(res, "text", None) is not None:
            value["text"] = res.text  # type: ignore[union-attr]
        else:
            value["blob"] = getattr(res, "blob", None)
        return value
    if isinstance(block, ResourceLink):
        return {
            "type": "resource_link",
            "uri": str(block.uri),
            "name": block.name,
            "mime_type": block.mime_type,
            "description": block.description,
        }
    if isinstance(block, BaseModel):
        return block.model_dump(mode="json", exclude_none=True)
    return block


# --- small helpers ---------------------------------------------------------------


def _server_info(client: Client) -> dict[str, Any]:
    # What the server says about itself, kept with the cached listing so a
    # catalog can summarise the namespace without starting the server.
    info = getattr(client, "server_info", None)
    out: dict[str, Any] = {}
    if info is not None:
        out["name"], out["title"], out["version"] = info.name, getattr(info, "title", None), info.version
    instructions = getattr(client, "instructions", None)
    if instructions:
        out["instructions"] = _clip(str(instructions))
    return {k: v for k, v in out.items() if v is not None}


def _session_gone(exc: MCPError) -> bool:
    # How the SDK reports an HTTP 404 for our session id (server restarted or
    # expired it): the request was refused, not processed.
    return exc.code == INVALID_REQUEST and exc.message == "Session terminated"




def _clip(text: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + "… (truncated)"


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
