"""The servers serve_bench.py measures tether against, each run in a process of its own.

    python bench/serve_peers.py floor PORT     # the MCP SDK's own server, bare Monty, no journal
    python bench/serve_peers.py engine PORT    # the floor's server running tether's Runtime.execute
    python bench/serve_peers.py fastmcp PORT   # FastMCP with its Code Mode transform, its defaults

Both serve MCP over streamable HTTP at http://127.0.0.1:PORT/mcp and offer one
``execute(code)`` tool whose program calls the bench tool ``get`` of common.py
(the function every contender shares).

The floor is what serving a code-mode program costs with nothing tether adds:
the SDK's ``MCPServer``, and the program run by ``feed_run`` in one warm
``AsyncMonty`` pool the size of tether's default (1–2 workers), with the tool
as its async host function — no journal, no policy, no signing, no check.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pydantic_monty as pm
import uvicorn

import common

HOST = "127.0.0.1"


def floor_app() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("floor", log_level="WARNING")
    modules = {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": common.get})})}
    state: dict[str, Any] = {}
    lock = asyncio.Lock()

    async def pool() -> Any:
        # Opened on the server's own loop at the first call, kept warm for the rest.
        async with lock:
            if "pool" not in state:
                p = pm.AsyncMonty(min_processes=1, max_processes=2)
                await p.__aenter__()
                state["pool"] = p
        return state["pool"]

    @server.tool()
    async def execute(code: str) -> str:
        """Run a Python program that calls tools.bench.get; its last expression is the result."""
        async with (await pool()).checkout(external_modules=modules) as session:
            return str(await session.feed_run(code))

    return server.streamable_http_app(host=HOST)


def engine_app() -> Any:
    """The floor's server with tether's engine in place of bare Monty: ``execute`` is ``Runtime.execute``.

    tether's runtime as ``tether serve`` opens it (its defaults: the SQLite file store under TETHER_HOME,
    quotas, signing, the journal), without tether's serving layer (admission, auth, console and metrics
    routes, progress, result shaping). Between the floor and tether serve, it tells the engine's share of
    the gap from the serving layer's (serve_bench.py --only floor,engine,tether_file).
    """
    import contextlib
    import gc

    from mcp.server.mcpserver import MCPServer

    from tether._app import open_runtime, resolve_tool_spec
    from tether._config import load_config

    server = MCPServer("engine", log_level="WARNING")
    state: dict[str, Any] = {}
    lock = asyncio.Lock()

    async def runtime() -> Any:
        async with lock:
            if "rt" not in state:
                stack = contextlib.AsyncExitStack()
                config = load_config(None)
                state["rt"] = await stack.enter_async_context(
                    open_runtime(config, tools=[resolve_tool_spec(common.__file__)]))
                state["stack"] = stack  # open for the server's life
                # As `tether serve` does once its app is built (start.py): what startup made is frozen out of the
                # collector's sight, so the two differ only by tether's serving layer.
                gc.collect()
                gc.freeze()
        return state["rt"]

    @server.tool()
    async def execute(code: str) -> str:
        """Run a Python program that calls tools.bench.get; its last expression is the result."""
        result = await (await runtime()).execute(code)
        return str(result.result) if result.status == "completed" else f"{result.status}: {result.error}"

    return server.streamable_http_app(host=HOST)


def fastmcp_app() -> Any:
    from fastmcp import FastMCP
    from fastmcp.experimental.transforms.code_mode import CodeMode

    mcp = FastMCP("bench")
    mcp.tool(common.get)
    mcp.add_transform(CodeMode())
    return mcp.http_app(path="/mcp")


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    app = {"floor": floor_app, "engine": engine_app, "fastmcp": fastmcp_app}[kind]()
    logging.basicConfig(level=logging.WARNING)
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
