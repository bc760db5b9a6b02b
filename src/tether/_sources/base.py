"""What a source of tools is to the process that loads it, and the ``${VAR}`` expansion sources share.

Three kinds implement :class:`Source`: Python modules (``python.PythonSource``),
MCP servers (``mcp.MCPSource``, and the loader's lazily started stand-in for a
server whose listing is cached) and OpenAPI documents (``openapi.OpenAPISource``).
``loader.SourceSet`` drives them through this protocol only.
"""

from __future__ import annotations

import os
import re
from typing import Protocol

from tether._tools.model import Tool
from tether.errors import ConfigError

__all__ = ["ENV_REF", "Source", "expand_env"]

# ``${NAME}``: a reference to an environment variable in a source's env or headers.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Source(Protocol):
    """One source of tools, as a process loads it.

    ``await start()`` makes its tools ready, raising if it cannot (and leaving
    nothing running: ``close()`` is still safe); ``tools()`` returns them.
    ``problems`` lists what was skipped and why (``{"operation" | "tool": ...,
    "problem": ...}``); ``summary`` is the namespace's one line for
    ``sources()`` and the prompt. ``ensure_live()`` connects a source that
    connects lazily or has lost its connection (a no-op for the others);
    ``started`` is false only while such a source has not connected.
    """

    @property
    def problems(self) -> list[dict[str, str]]: ...

    @property
    def summary(self) -> str | None: ...

    @property
    def started(self) -> bool: ...

    async def start(self) -> None: ...

    def tools(self) -> list[Tool]: ...

    async def ensure_live(self) -> None: ...

    async def close(self) -> None: ...


def expand_env(value: str, where: str) -> str:
    """``value`` with each ``${NAME}`` replaced from the environment; ``where`` names it in the error."""

    def sub(match: re.Match[str]) -> str:
        var = match.group(1)
        found = os.environ.get(var)
        if found is None:
            raise ConfigError(
                f"{where} references ${{{var}}}, which is not set",
                next_action=f"Set the environment variable {var} before starting tether.",
            )
        return found

    return ENV_REF.sub(sub, value)
