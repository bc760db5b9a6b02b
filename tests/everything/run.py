"""Starting the MCP project's reference server (npm @modelcontextprotocol/server-everything, pinned by
package-lock.json) and hostile.mjs, an upstream built on the same SDK that does what the reference server won't."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import free_port, npm_ci, start_until, stop_process

HERE = Path(__file__).parent
SERVER = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
HOSTILE = HERE / "hostile.mjs"


def ensure_installed() -> None:
    npm_ci(HERE, installed=SERVER.is_file(), need="the reference-server tests")


def stdio_command() -> list[str]:
    ensure_installed()
    return ["node", str(SERVER), "stdio"]


def hostile_command() -> list[str]:
    ensure_installed()
    return ["node", str(HOSTILE)]


def start_http(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The server over streamable HTTP on a free port: (process, its /mcp URL) once it listens."""
    ensure_installed()
    port = free_port()
    proc = start_until(["node", str(SERVER), "streamableHttp"], log, b"listening on port",
                       "server-everything over HTTP", env={**os.environ, "PORT": str(port)})
    return proc, f"http://127.0.0.1:{port}/mcp"


stop = stop_process
