"""Starting the MCP project's reference server (npm @modelcontextprotocol/server-everything, pinned by
package-lock.json) and hostile.mjs, an upstream built on the same SDK that does what the reference server won't."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).parent
SERVER = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
HOSTILE = HERE / "hostile.mjs"


def ensure_installed() -> None:
    if shutil.which("node") is None:
        raise RuntimeError("node is not installed; the reference-server tests need Node.js 20+")
    if not SERVER.is_file():
        # `make test` runs `npm ci` first; this covers running pytest directly on a fresh clone.
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, capture_output=True,
                       timeout=300)


def stdio_command() -> list[str]:
    ensure_installed()
    return ["node", str(SERVER), "stdio"]


def hostile_command() -> list[str]:
    ensure_installed()
    return ["node", str(HOSTILE)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The server over streamable HTTP on a free port: (process, its /mcp URL) once it listens."""
    ensure_installed()
    port = free_port()
    out = open(log, "wb")
    proc = subprocess.Popen(["node", str(SERVER), "streamableHttp"], env={**os.environ, "PORT": str(port)},
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while b"listening on port" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server-everything did not start over HTTP: {log.read_text()}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp"


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
